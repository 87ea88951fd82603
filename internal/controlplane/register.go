package controlplane

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"space/api"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/store"
	"space/internal/workerproto"
)

// HeartbeatTimeout is how long a standalone worker may stay silent before
// it gets no new sandboxes; workers register again every
// HeartbeatInterval.
const (
	HeartbeatInterval = 10 * time.Second
	HeartbeatTimeout  = 3 * HeartbeatInterval
)

// LoadWorkers connects the standalone workers the store knows, so their
// sandboxes are served before the workers' next heartbeat, and takes the
// heartbeats other replicas recorded for those it knows: a worker
// registers with one replica, and every replica serves its sandboxes.
// It runs at start and then every syncInterval. It asks each
// (at once, under the Status verb's deadline) for its status: one that
// speaks another worker protocol version is not connected; one that does
// not answer is, and is checked when it registers again.
func (s *Server) LoadWorkers(ctx context.Context) error { return s.loadWorkers(ctx, false) }

// loadWorkers is LoadWorkers; recent leaves out the workers this process
// does not know whose last heartbeat is older than HeartbeatTimeout (the
// periodic sync: they are gone, or refused).
func (s *Server) loadWorkers(ctx context.Context, recent bool) error {
	if s.cfg.WorkerToken == "" {
		return nil
	}
	all, err := s.cfg.Store.ListWorkers(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, w := range all {
		if s.isLocal(w.ID) {
			continue
		}
		// A worker this process knows at that address: its heartbeat
		// may have reached another replica.
		s.mu.Lock()
		known, ok := s.workers[w.ID].(*Remote)
		if ok && known.base.String() == w.Address {
			if w.LastHeartbeat.After(s.seen[w.ID]) {
				s.seen[w.ID] = w.LastHeartbeat
			}
		}
		s.mu.Unlock()
		if ok && known.base.String() == w.Address {
			continue
		}
		if recent && s.now().Sub(w.LastHeartbeat) >= HeartbeatTimeout {
			continue
		}
		rm, err := NewRemote(w.ID, w.Address, s.cfg.WorkerToken)
		if err != nil {
			s.log.Warn("skipping stored worker until it registers again", "worker_id", w.ID, "err", err)
			continue
		}
		wg.Go(func() {
			st, err := rm.Status(ctx)
			if err == nil {
				if err := workerproto.CheckVersion(w.ID, st.Protocol); err != nil {
					s.log.Error("not connecting stored worker", "worker_id", w.ID, "err", err)
					return
				}
				rm.stated(st.Protocol, st.Capabilities)
			} else {
				// What it registered with, until it answers.
				var c workerproto.Capabilities
				if len(w.Capabilities) > 0 && json.Unmarshal(w.Capabilities, &c) == nil {
					rm.stated(w.Protocol, c)
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if cur, registered := s.workers[w.ID]; registered && cur != Worker(known) {
				return // it registered meanwhile, and was checked
			}
			s.workers[w.ID] = rm
			s.seen[w.ID] = w.LastHeartbeat
		})
	}
	wg.Wait()
	return nil
}

func (s *Server) isLocal(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[id]
	if !ok {
		return false
	}
	_, local := w.(*Local)
	return local
}

// healthy reports whether placement may use w: in-process workers always,
// standalone ones while their heartbeat is recent, or those found through
// a Lease while it has not expired.
func (s *Server) healthy(w Worker) bool {
	if _, ok := w.(*Local); ok {
		return true
	}
	if !s.answering(w) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// One that takes leases and holds none refuses new sandboxes: the
	// leader has not leased it yet, or lost it.
	if p := s.probes[w.ID()]; p != nil && p.answered && p.status.Capabilities.Fencing && !p.status.Leased {
		return false
	}
	return s.liveLocked(w.ID(), s.now())
}

// liveLocked reports whether standalone worker id counts as alive at now:
// its Lease's expiry is later if it was found through one, else its last
// registration is less than HeartbeatTimeout old.
//
// +checklocks:s.mu
func (s *Server) liveLocked(id string, now time.Time) bool {
	if exp, leased := s.leased[id]; leased {
		return now.Before(exp)
	}
	return now.Sub(s.seen[id]) < HeartbeatTimeout
}

func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if s.cfg.WorkerToken == "" || !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.WorkerToken)) != 1 {
		httpapi.WriteError(w, fmt.Errorf("worker token missing or wrong: %w", httpapi.ErrUnauthenticated))
		return
	}
	var req api.RegisterWorker
	if err := httpapi.DecodeJSON(r, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	wk, err := s.register(r.Context(), req, s.now(), 0)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, s.workerView(r.Context(), wk))
}

// RegisterLeased connects the standalone worker req describes, found
// through a Lease renewed at renewed for d: it counts as alive until
// renewed+d, by this process's clock, unless renewed again. It checks req
// as a registration over HTTP is checked, and reconciles the worker when
// it was not alive before. Errors wrap errkind.InvalidArgument (a bad
// field), errkind.FailedPrecondition (a worker protocol this control
// plane does not speak, or no worker token), or errkind.Conflict.
func (s *Server) RegisterLeased(ctx context.Context, req api.RegisterWorker, renewed time.Time, d time.Duration) error {
	if s.cfg.WorkerToken == "" {
		return fmt.Errorf("worker %s: this control plane has no worker token to reach standalone workers with: %w", req.ID, errkind.FailedPrecondition)
	}
	if d <= 0 {
		return fmt.Errorf("worker %s: lease duration %v: %w", req.ID, d, errkind.InvalidArgument)
	}
	_, err := s.register(ctx, req, renewed, d)
	return err
}

// LeaseEnded marks the worker found through a Lease that has id as not
// seen: its Lease was deleted, or stopped naming it. It takes no new
// sandboxes until a Lease names it again.
func (s *Server) LeaseEnded(id string) {
	s.mu.Lock()
	_, leased := s.leased[id]
	if leased {
		s.leased[id] = time.Time{}
	}
	s.mu.Unlock()
	if leased {
		s.log.Info("worker lease ended", "worker_id", id)
	}
}

// register checks req, records the worker in the store and connects it,
// as seen at seen; leased, if positive, is how long its Lease lasts from
// seen (0: it registered over HTTP and is alive for HeartbeatTimeout).
// A worker that was not alive before is reconciled.
func (s *Server) register(ctx context.Context, req api.RegisterWorker, seen time.Time, leased time.Duration) (Worker, error) {
	if !store.ValidID(req.ID) || len(req.ID) > 32 {
		return nil, httpapi.Invalid("id", "%.64q: 1-32 characters of [A-Za-z0-9_.-]", req.ID)
	}
	if u, err := url.Parse(req.Address); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, httpapi.Invalid("address", "%.100q: want https://host:port (workers serve TLS)", req.Address)
	}
	if req.VCPUs < 0 || req.MemoryMiB < 0 {
		return nil, httpapi.Invalid("vcpus", "negative capacity")
	}
	if s.isLocal(req.ID) {
		return nil, fmt.Errorf("worker id %s is the server's embedded worker: %w", req.ID, errkind.Conflict)
	}
	caps := workerproto.CapabilitiesOf(req.Capabilities)
	if err := workerproto.CheckVersion(req.ID, req.Protocol); err != nil {
		s.disconnect(req.ID, err)
		return nil, err
	}
	if err := caps.Validate(); err != nil {
		return nil, err
	}
	capsJSON, err := json.Marshal(caps)
	if err != nil {
		return nil, fmt.Errorf("worker %s: encode capabilities: %w", req.ID, err)
	}
	// The capabilities are kept so that a control plane that starts while
	// the worker is down still knows it (recovery.go: whether it fences,
	// which chunk store it shares).
	if err := s.cfg.Store.UpsertWorker(ctx, store.Worker{
		ID: req.ID, Address: req.Address, VCPUs: req.VCPUs, MemoryMiB: req.MemoryMiB, LastHeartbeat: seen,
		Protocol: req.Protocol, Capabilities: capsJSON,
	}); err != nil {
		return nil, err
	}
	s.mu.Lock()
	prev, known := s.workers[req.ID].(*Remote)
	s.mu.Unlock()
	var wk Worker = prev
	if !known || prev.base.String() != req.Address {
		rm, err := NewRemote(req.ID, req.Address, s.cfg.WorkerToken)
		if err != nil {
			return nil, err
		}
		wk = rm
	}
	wk.(*Remote).stated(req.Protocol, caps)
	now := s.now()
	s.mu.Lock()
	s.workers[req.ID] = wk
	wasLive := s.liveLocked(req.ID, now)
	s.seen[req.ID] = seen
	if leased > 0 {
		s.leased[req.ID] = seen.Add(leased)
	} else {
		delete(s.leased, req.ID) // registered over HTTP: its heartbeats count
	}
	live := s.liveLocked(req.ID, now)
	s.mu.Unlock()
	if live && (!known || !wasLive) {
		s.log.Info("worker registered", "worker_id", req.ID, "address", req.Address, "protocol", req.Protocol,
			"vmm", caps.VMM, "accel", caps.Accel, "lease", leased > 0)
		// Settle what happened on it while it was away, leaving alone
		// what any replica works on (claims.go); errors are retried at
		// its next registration, or by the leader's reconcile.
		busy, err := s.claims.all(ctx)
		if err == nil {
			err = s.reconcileWorker(ctx, wk, busy)
		}
		if err != nil {
			s.log.Warn("reconcile a worker that registered", "worker_id", req.ID, "err", err)
		}
	}
	return wk, nil
}

// disconnect drops standalone worker id, which speaks a worker protocol
// this control plane does not (why): its sandboxes are unreachable until
// it registers speaking one.
func (s *Server) disconnect(id string, why error) {
	s.mu.Lock()
	_, known := s.workers[id].(*Remote)
	if known {
		delete(s.workers, id)
	}
	s.mu.Unlock()
	if known {
		s.log.Error("worker disconnected", "worker_id", id, "err", why)
	}
}

// workerView is the API's picture of wk, from what its probe says: its
// status, or nothing but its name when it does not answer.
func (s *Server) workerView(ctx context.Context, wk Worker) api.Worker {
	return s.workerViews(ctx, []Worker{wk})[0]
}

// workerViews returns the views of workers, probing at once those whose
// last probe is not fresh.
func (s *Server) workerViews(ctx context.Context, workers []Worker) []api.Worker {
	caps := s.capacities(ctx, workers)
	out := make([]api.Worker, 0, len(workers))
	for _, wk := range workers {
		st, ok := caps[wk.ID()]
		v := api.Worker{ID: wk.ID(), Healthy: ok && s.healthy(wk)}
		if rm, isRemote := wk.(*Remote); isRemote {
			v.Address = rm.base.String()
			if p, caps := rm.statement(); caps != nil {
				c := caps.API()
				v.Protocol, v.Capabilities = p, &c
			}
		}
		s.mu.Lock()
		v.LastHeartbeat = s.seen[wk.ID()]
		s.mu.Unlock()
		if ok {
			c := st.Capabilities.API()
			v.Protocol, v.Capabilities = st.Protocol, &c
			v.VCPUs, v.MemoryMiB, v.UsedVCPUs, v.UsedMemoryMiB, v.Sandboxes = st.VCPUs, st.MemoryMiB, st.UsedVCPUs, st.UsedMemoryMiB, st.Sandboxes
			v.DiskMiB, v.FreeDiskMiB = st.DiskMiB, st.FreeDiskMiB
		}
		out = append(out, v)
	}
	return out
}

func (s *Server) handleListWorkers(w http.ResponseWriter, r *http.Request) {
	if !callerOf(r).admin {
		httpapi.WriteError(w, fmt.Errorf("listing workers needs an admin key: %w", errkind.PermissionDenied))
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, api.WorkerList{Workers: s.workerViews(r.Context(), s.workerList())})
}

// AdvertiseLocal records this process's embedded worker id in the store
// as reachable at address (https://host:port, where it serves the worker
// API with the worker token), and renews the record every
// HeartbeatInterval until ctx ends: the other replicas sharing the store
// then reach it as they reach a standalone worker, so any of them serves
// its sandboxes. This process keeps calling it in process.
func (s *Server) AdvertiseLocal(ctx context.Context, id, address string) error {
	if u, err := url.Parse(address); err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("advertise worker %s at %.100q: want https://host:port: %w", id, address, errkind.InvalidArgument)
	}
	wk, err := s.worker(id)
	if err != nil || !s.isLocal(id) {
		return fmt.Errorf("advertise worker %s: not this process's embedded worker: %w", id, errkind.FailedPrecondition)
	}
	beat := func() {
		st, err := wk.Status(ctx)
		if err != nil {
			s.log.Warn("advertise the embedded worker: status", "worker_id", id, "err", err)
			return
		}
		if err := s.cfg.Store.UpsertWorker(ctx, store.Worker{
			ID: id, Address: address, VCPUs: st.VCPUs, MemoryMiB: st.MemoryMiB, LastHeartbeat: s.now(),
		}); err != nil && ctx.Err() == nil {
			s.log.Warn("advertise the embedded worker", "worker_id", id, "err", err)
		}
	}
	beat()
	s.log.Info("embedded worker reachable by other replicas", "worker_id", id, "address", address)
	t := time.NewTicker(HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			beat()
		}
	}
}
