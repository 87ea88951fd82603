package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/sandbox"
	"space/internal/store"
)

// The pool: for shapes the worker was asked to keep ready (KeepPool), a
// few sandboxes restored from the shape's warm template wait, running and
// with their agent connected. A create of that shape takes one: it gets
// its ID, team, spec, hostname, machine and boot IDs, clock and fresh
// entropy, and is running at once; the pool then restores a replacement
// in the background. Pool members are internal (a restart removes them)
// and keep the directories and control group they were made with
// (record.Slot).
//
// Members count against the worker's capacity like any sandbox; a create
// that finds no room takes a member's place (the member goes).

// poolTeam owns pool members until a create takes one.
const poolTeam = "space-system"

// poolRetry is how long the pool waits after a failed refill.
const poolRetry = 10 * time.Second

// shapeKey identifies the shape a pool keeps: what the warm template
// fixes (the environment is applied per exec, so it is not part of it).
func shapeKey(spec Spec) string {
	return fmt.Sprintf("%s/%dc/%dm/%dd", spec.Template, spec.VCPUs, spec.MemoryMiB, spec.DiskMiB)
}

// KeepPool keeps n sandboxes of spec's shape restored and ready for
// creates (0 stops refilling; members already made stay until taken or
// the worker restarts). The shape's warm template must exist (Warm).
func (w *Worker) KeepPool(spec Spec, n int) error {
	if err := validateSpec(spec); err != nil {
		return err
	}
	if n < 0 || n > 16 {
		return fmt.Errorf("pool of %d: want 0..16", n)
	}
	spec.Env, spec.ColdBoot = nil, false
	spec = withNIC(spec)
	spec.Network = &Network{} // a member allows nothing until a create takes it
	w.mu.Lock()
	w.pools[shapeKey(spec)] = poolTarget{spec: spec, size: n}
	w.mu.Unlock()
	w.kickPool()
	return nil
}

type poolTarget struct {
	spec Spec
	size int
}

func (w *Worker) kickPool() {
	select {
	case w.poolKick <- struct{}{}:
	default:
	}
}

// poolLoop refills the pools until Close.
func (w *Worker) poolLoop() {
	defer w.watchers.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-w.poolKick:
		case <-time.After(poolRetry):
		}
		w.fillPools(ctx)
	}
}

// fillPools restores members until every pool has its size, one at a
// time (each restore takes a CPU for a moment).
func (w *Worker) fillPools(ctx context.Context) {
	if !w.serving() {
		return // no create takes a member until a lease comes
	}
	w.mu.Lock()
	targets := make([]poolTarget, 0, len(w.pools))
	for _, t := range w.pools {
		targets = append(targets, t)
	}
	w.mu.Unlock()
	for _, t := range targets {
		key := shapeKey(t.spec)
		for w.poolMembers(key) < t.size && ctx.Err() == nil {
			if err := w.addMember(ctx, t.spec, key); err != nil {
				switch {
				case errors.Is(err, ErrNoCapacity):
					w.log.Debug("pool waits for room", "shape", key)
				case ctx.Err() == nil:
					w.log.Warn("refill pool", "shape", key, "err", err)
				}
				break
			}
		}
	}
}

// addMember restores a member of pool key and warms it up, then offers
// it. Warming up runs a command (unlisted in the guest's process table):
// a restored guest runs its first commands slowly where its code is not
// hot yet (under TCG, QEMU translates it afresh), and the member's
// first user should not wait for that.
func (w *Worker) addMember(ctx context.Context, spec Spec, key string) error {
	id := store.NewSandboxID()
	if _, err := w.create(ctx, id, poolTeam, spec, createOpts{internal: true, pool: warmingUp}); err != nil {
		return err
	}
	s, err := w.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	agent := s.agent
	s.mu.Unlock()
	if agent != nil {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = agent.Exec(wctx, proto.ExecRequest{Argv: []string{"true"}, Unlisted: true}, client.IO{})
		cancel()
		if err != nil {
			w.log.Debug("warm up pool member", "sandbox_id", id, "err", err)
		}
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	s.rec.Pool = key // offered from now on
	s.mu.Unlock()
	return s.save()
}

// warmingUp is the pool key of a member being warmed up: no create takes
// it yet.
const warmingUp = "warming-up"

// poolMembers counts the members of pool key that are ready or on their
// way.
func (w *Worker) poolMembers(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.sandboxes {
		s.mu.Lock()
		if s.rec.Pool == key && s.rec.State != sandbox.Failed {
			n++
		}
		s.mu.Unlock()
	}
	return n
}

// takeMember removes a ready member of pool key from the worker's map
// and files it under id, or returns nil.
func (w *Worker) takeMember(key, id string) *sbx {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, taken := w.sandboxes[id]; taken || w.closed {
		return nil
	}
	for old, s := range w.sandboxes {
		s.mu.Lock()
		ready := s.rec.Pool == key && s.rec.State == sandbox.Running && s.agent != nil
		if ready {
			s.rec.Pool = "" // no longer counted, nor taken twice
		}
		s.mu.Unlock()
		if ready {
			delete(w.sandboxes, old)
			w.sandboxes[id] = s
			return s
		}
	}
	return nil
}

// fromPool hands a pool member to a create of sandbox id, if one of
// spec's shape is ready. It reports whether it did; on false nothing
// changed for id (a member that failed the handover is gone).
func (w *Worker) fromPool(ctx context.Context, id, team string, spec Spec) (Info, bool) {
	// A member's guest holds no placeholders: a create that grants
	// secrets boots (or restores the warm template).
	if spec.ColdBoot || spec.Network == nil || len(spec.Secrets) > 0 || !store.ValidSandboxID(id) || !store.ValidID(team) || validateSpec(spec) != nil {
		return Info{}, false // create says what is wrong
	}
	key := shapeKey(spec)
	s := w.takeMember(key, id)
	if s == nil {
		w.mu.Lock()
		kept := w.pools[key].size > 0
		w.mu.Unlock()
		if kept {
			w.metrics.poolMisses.Inc()
		}
		return Info{}, false
	}
	w.kickPool()
	s.op.Lock()
	defer s.op.Unlock()
	t0 := time.Now()
	slot, err := w.handOver(ctx, s, id, team, spec)
	if err != nil {
		w.log.Warn("pool member failed its handover; dropping it", "sandbox_id", id, "err", err)
		derr := w.destroy(context.WithoutCancel(ctx), s)
		w.mu.Lock()
		delete(w.sandboxes, id)
		w.mu.Unlock()
		if derr != nil {
			w.log.Error("remove pool member", "dir", s.dir, "err", derr)
		}
		return Info{}, false
	}
	w.metrics.poolHits.Inc()
	w.log.Info("sandbox started", "sandbox_id", id, "slot", slot, "by", "pool", "took", time.Since(t0))
	return s.info(), true
}

// handOver gives pool member s its new identity: the guest's clock,
// entropy, hostname, machine-id and boot_id first, then the record, which commits it (a crash
// before leaves an internal member, which a restart removes), then the
// create's egress policy to the member's gateway (which allowed nothing
// until then). The caller holds s.op.
func (w *Worker) handOver(ctx context.Context, s *sbx, id, team string, spec Spec) (slot string, err error) {
	s.mu.Lock()
	agent, gw := s.agent, s.gw
	s.mu.Unlock()
	if agent == nil || gw == nil {
		return "", errors.New("no agent connection or gateway")
	}
	policy, err := w.fullPolicy(s, *spec.Network)
	if err != nil {
		return "", err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ident, err := guestvm.PostRestore(pctx, agent, Hostname(id))
	if err != nil {
		return "", fmt.Errorf("post-restore: %w", err)
	}
	if ident.MachineID == "" {
		w.log.Warn("agent predates per-sandbox machine and boot ids; the sandbox keeps its snapshot's", "sandbox_id", id)
	}
	w.crash("create.pool-handed-over")
	if err := w.resealCA(s, s.id(), id); err != nil {
		return "", fmt.Errorf("the sandbox's CA: %w", err)
	}
	s.mu.Lock()
	s.rec.Slot = s.rec.slot()
	slot = s.rec.Slot
	s.rec.ID, s.rec.Team, s.rec.Spec = id, team, spec
	s.lastActive = time.Now()
	s.rec.Internal, s.rec.Created = false, time.Now().UTC()
	if s.rec.VM != nil {
		vm := *s.rec.VM
		vm.StartedBy = "pool"
		s.rec.VM = &vm
	}
	s.mu.Unlock()
	if err := s.save(); err != nil {
		return slot, err
	}
	gw.SetPolicy(policy)
	return slot, nil
}

// evictMember removes one ready pool member to make room, reporting
// whether there was one.
func (w *Worker) evictMember(ctx context.Context) bool {
	w.mu.Lock()
	var victim *sbx
	var key string
	for k, s := range w.sandboxes {
		s.mu.Lock()
		if s.rec.Pool != "" && s.rec.State == sandbox.Running {
			victim, key = s, k
			s.rec.Pool = ""
		}
		s.mu.Unlock()
		if victim != nil {
			break
		}
	}
	w.mu.Unlock()
	if victim == nil {
		return false
	}
	victim.op.Lock()
	defer victim.op.Unlock()
	if err := w.destroy(ctx, victim); err != nil {
		w.log.Error("evict pool member", "sandbox_id", key, "err", err)
		return false
	}
	w.mu.Lock()
	delete(w.sandboxes, key)
	w.mu.Unlock()
	w.log.Info("evicted a pool member to make room", "sandbox_id", key)
	return true
}
