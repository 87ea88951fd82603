package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"space/internal/errkind"
	"space/internal/store"
	"space/internal/testenv"
)

// shortTTL is a lease ttl tests wait out.
const shortTTL = 150 * time.Millisecond

func mustAcquire(t *testing.T, s store.Store, name, holder string, ttl time.Duration) store.Lease {
	t.Helper()
	l, err := s.AcquireLease(t.Context(), name, holder, ttl)
	if err != nil {
		t.Fatalf("setup: AcquireLease(%s, %s): %v", name, holder, err)
	}
	return l
}

// takeOver waits until l expires and holder acquires its name.
func takeOver(t *testing.T, s store.Store, l store.Lease, holder string) store.Lease {
	t.Helper()
	var got store.Lease
	testenv.Eventually(t, 10*time.Second, func() bool {
		var err error
		got, err = s.AcquireLease(t.Context(), l.Name, holder, time.Minute)
		if err != nil && !errors.Is(err, errkind.Conflict) {
			t.Fatalf("AcquireLease(%s, %s) = %v, want nil or a conflict", l.Name, holder, err)
		}
		return err == nil
	})
	return got
}

func testLeases(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)

	a, err := s.AcquireLease(ctx, "sandbox/sbx_1", "r1", time.Minute)
	if err != nil {
		t.Fatalf("AcquireLease(sandbox/sbx_1, r1) = %v", err)
	}
	if a.Name != "sandbox/sbx_1" || a.Holder != "r1" || a.Token <= 0 || a.Expired ||
		!a.Expires.After(a.Acquired) || a.Expires.Sub(a.Acquired) > time.Minute+time.Second {
		t.Errorf("AcquireLease(sandbox/sbx_1, r1) = %+v, want r1's lease for a minute", a)
	}
	_, err = s.AcquireLease(ctx, "sandbox/sbx_1", "r2", time.Minute)
	if !errors.Is(err, errkind.Conflict) || !strings.Contains(err.Error(), "r1") {
		t.Errorf("AcquireLease(sandbox/sbx_1, r2) while r1 holds it = %v, want a conflict naming r1", err)
	}

	// The holder re-acquiring extends its lease and keeps the token.
	again, err := s.AcquireLease(ctx, "sandbox/sbx_1", "r1", 2*time.Minute)
	if err != nil {
		t.Fatalf("AcquireLease(sandbox/sbx_1, r1) again = %v", err)
	}
	if again.Token != a.Token || !again.Acquired.Equal(a.Acquired) || !again.Expires.After(a.Expires) {
		t.Errorf("AcquireLease(sandbox/sbx_1, r1) again = %+v, want token %d extended past %v", again, a.Token, a.Expires)
	}
	renewed, err := s.RenewLease(ctx, a, 3*time.Minute)
	if err != nil {
		t.Fatalf("RenewLease(%+v) = %v", a, err)
	}
	if renewed.Token != a.Token || !renewed.Expires.After(again.Expires) {
		t.Errorf("RenewLease() = %+v, want token %d extended past %v", renewed, a.Token, again.Expires)
	}

	// Tokens grow with every acquisition, across names and releases.
	b := mustAcquire(t, s, "sandbox/sbx_2", "r2", time.Minute)
	l := mustAcquire(t, s, "leader", "r2", time.Minute)
	if !(a.Token < b.Token && b.Token < l.Token) {
		t.Errorf("tokens %d, %d, %d, want increasing", a.Token, b.Token, l.Token)
	}
	got, err := s.ListLeases(ctx, "sandbox/")
	if err != nil {
		t.Fatalf("ListLeases(sandbox/) = %v", err)
	}
	if diff := cmp.Diff([]store.Lease{renewed, b}, got); diff != "" {
		t.Errorf("ListLeases(sandbox/) (-want +got):\n%s", diff)
	}
	if got, err := s.ListLeases(ctx, ""); err != nil || len(got) != 3 {
		t.Errorf("ListLeases(\"\") = %d leases, %v; want 3", len(got), err)
	}
	if got, err := s.ListLeases(ctx, "sandbox/sbx_%"); err != nil || len(got) != 0 {
		t.Errorf("ListLeases(sandbox/sbx_%%) = %v, %v; want none (no wildcards)", got, err)
	}

	if err := s.ReleaseLease(ctx, b); err != nil {
		t.Fatalf("ReleaseLease(%+v) = %v", b, err)
	}
	if err := s.ReleaseLease(ctx, b); err != nil {
		t.Errorf("ReleaseLease() twice = %v, want nil", err)
	}
	_, err = s.RenewLease(ctx, b, time.Minute)
	wantKind(t, "RenewLease() after release", err, store.ErrLeaseLost, errkind.FailedPrecondition)
	b2 := mustAcquire(t, s, "sandbox/sbx_2", "r2", time.Minute)
	if b2.Token <= l.Token {
		t.Errorf("AcquireLease() after release: token %d, want above %d", b2.Token, l.Token)
	}
	// A stale lease cannot release the new one.
	if err := s.ReleaseLease(ctx, b); err != nil {
		t.Errorf("ReleaseLease(stale) = %v, want nil", err)
	}
	if _, err := s.RenewLease(ctx, b2, time.Minute); err != nil {
		t.Errorf("RenewLease(new) after ReleaseLease(stale) = %v, want nil", err)
	}
}

func testLeaseExpiry(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	old := mustAcquire(t, s, "snapshot/snp_1", "r1", shortTTL)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ls, err := s.ListLeases(ctx, "snapshot/")
		if err != nil {
			t.Fatalf("ListLeases() = %v", err)
		}
		return len(ls) == 1 && ls[0].Expired
	})
	// Expired, nobody took it: its holder may still renew it.
	renewed, err := s.RenewLease(ctx, old, shortTTL)
	if err != nil || renewed.Token != old.Token {
		t.Errorf("RenewLease(expired, not taken) = %+v, %v; want token %d", renewed, err, old.Token)
	}
	nl := takeOver(t, s, old, "r2")
	if nl.Holder != "r2" || nl.Token <= old.Token {
		t.Errorf("AcquireLease() of an expired lease = %+v, want r2's with a token above %d", nl, old.Token)
	}
	_, err = s.RenewLease(ctx, old, time.Minute)
	wantKind(t, "RenewLease() after takeover", err, store.ErrLeaseLost, errkind.FailedPrecondition)
	if err := s.ReleaseLease(ctx, old); err != nil {
		t.Errorf("ReleaseLease(taken over) = %v, want nil", err)
	}
	if ls, err := s.ListLeases(ctx, "snapshot/"); err != nil || len(ls) != 1 || ls[0].Token != nl.Token || ls[0].Expired {
		t.Errorf("ListLeases() after takeover = %+v, %v; want only r2's live lease", ls, err)
	}

	// The same holder re-acquiring its own expired lease gets a new token:
	// something else may have happened in between.
	mine := mustAcquire(t, s, "leader", "r1", shortTTL)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ls, err := s.ListLeases(ctx, "leader")
		if err != nil {
			t.Fatalf("ListLeases() = %v", err)
		}
		return len(ls) == 1 && ls[0].Expired
	})
	again := mustAcquire(t, s, "leader", "r1", time.Minute)
	if again.Token <= mine.Token {
		t.Errorf("AcquireLease() of own expired lease: token %d, want above %d", again.Token, mine.Token)
	}
}

func testLeaseBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	for _, tt := range []struct {
		name, holder string
		ttl          time.Duration
	}{
		{"", "r1", time.Second},
		{"has space", "r1", time.Second},
		{strings.Repeat("x", 257), "r1", time.Second},
		{"leader", "", time.Second},
		{"leader", "r\n1", time.Second},
		{"leader", "r1", 0},
		{"leader", "r1", -time.Second},
		{"leader", "r1", time.Microsecond},
	} {
		_, err := s.AcquireLease(ctx, tt.name, tt.holder, tt.ttl)
		wantKind(t, fmt.Sprintf("AcquireLease(%.20q, %q, %v)", tt.name, tt.holder, tt.ttl), err, store.ErrInvalid, errkind.InvalidArgument)
	}
	l := mustAcquire(t, s, "leader", "r1", time.Minute)
	_, err := s.RenewLease(ctx, l, 0)
	wantKind(t, "RenewLease(ttl 0)", err, store.ErrInvalid, errkind.InvalidArgument)
	if ls, err := s.ListLeases(ctx, ""); err != nil || len(ls) != 1 {
		t.Errorf("ListLeases() after bad input = %+v, %v; want one lease", ls, err)
	}
}

func testFencing(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := mustSandbox(t, s, newSandbox("t1"))
	sn, err := s.CreateSnapshot(ctx, store.Snapshot{ID: store.NewSnapshotID(), TeamID: "t1", SandboxID: sb.ID, State: store.SnapshotCreating})
	if err != nil {
		t.Fatalf("setup: CreateSnapshot() = %v", err)
	}
	tp, err := s.CreateTemplate(ctx, store.Template{TeamID: "t1", Name: "base", State: store.TemplateBuilding})
	if err != nil {
		t.Fatalf("setup: CreateTemplate() = %v", err)
	}
	woken := mustSandbox(t, s, sandboxWith("t1", store.StateSuspended, 1, 256))
	asleep := mustSandbox(t, s, sandboxWith("t1", store.StateSuspended, 1, 256))

	// While the lease holds, fenced writes behave as the plain ones. (A
	// long lease here: the short one below must not expire before its
	// checks are done.)
	fl := s.Fenced(mustAcquire(t, s, "leader", "r1", time.Minute))
	_, err = fl.UpdateSandboxWithinQuota(ctx, resumed(woken), store.Quota{Sandboxes: 1})
	wantRefused(t, s, "Fenced(live).UpdateSandboxWithinQuota(resume over quota)", err, "team t1 quota: 1 of 1 sandboxes in use", woken)
	if woken, err = fl.UpdateSandboxWithinQuota(ctx, resumed(woken), store.Quota{Sandboxes: 2}); err != nil || woken.Version != 2 {
		t.Fatalf("Fenced(live).UpdateSandboxWithinQuota(resume) = %+v, %v; want version 2", woken, err)
	}
	old := mustAcquire(t, s, "sandbox/"+sb.ID, "r1", shortTTL)
	f := s.Fenced(old)
	sb.State = store.StateRunning
	if sb, err = f.UpdateSandbox(ctx, sb); err != nil || sb.Version != 2 {
		t.Fatalf("Fenced(live).UpdateSandbox() = %+v, %v; want version 2", sb, err)
	}
	sn.State = store.SnapshotReady
	if sn, err = f.UpdateSnapshot(ctx, sn); err != nil || sn.Version != 2 {
		t.Fatalf("Fenced(live).UpdateSnapshot() = %+v, %v; want version 2", sn, err)
	}
	tp.State = store.TemplateReady
	if tp, err = f.UpdateTemplate(ctx, tp); err != nil || tp.Rev != 2 {
		t.Fatalf("Fenced(live).UpdateTemplate() = %+v, %v; want rev 2", tp, err)
	}
	extra, err := f.CreateSandbox(ctx, newSandbox("t1"))
	if err != nil {
		t.Fatalf("Fenced(live).CreateSandbox() = %v", err)
	}
	if err := f.DeleteSandbox(ctx, "t1", extra.ID); err != nil {
		t.Fatalf("Fenced(live).DeleteSandbox() = %v", err)
	}
	// The plain errors still come through.
	if _, err := f.UpdateSandbox(ctx, extra); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Fenced(live).UpdateSandbox(deleted) = %v, want ErrNotFound", err)
	}
	stale := sb
	stale.Version = 1
	if _, err := f.UpdateSandbox(ctx, stale); !errors.Is(err, store.ErrVersionConflict) {
		t.Errorf("Fenced(live).UpdateSandbox(stale version) = %v, want ErrVersionConflict", err)
	}

	// Taken over after expiry: the old holder can commit nothing.
	nl := takeOver(t, s, old, "r2")
	f = s.Fenced(old)
	lost := func(op string, err error) {
		t.Helper()
		wantKind(t, "Fenced(taken over)."+op, err, store.ErrLeaseLost, errkind.FailedPrecondition)
	}
	sb2 := sb
	sb2.State = store.StatePaused
	_, err = f.UpdateSandbox(ctx, sb2)
	lost("UpdateSandbox()", err)
	sn2 := sn
	sn2.State = store.SnapshotDeleting
	_, err = f.UpdateSnapshot(ctx, sn2)
	lost("UpdateSnapshot()", err)
	tp2 := tp
	tp2.State = store.TemplateDeleting
	_, err = f.UpdateTemplate(ctx, tp2)
	lost("UpdateTemplate()", err)
	nsb := newSandbox("t1")
	_, err = f.CreateSandbox(ctx, nsb)
	lost("CreateSandbox()", err)
	_, err = f.CreateSandboxWithinQuota(ctx, newSandbox("t1"), store.Quota{})
	lost("CreateSandboxWithinQuota()", err)
	_, err = f.UpdateSandboxWithinQuota(ctx, resumed(asleep), store.Quota{})
	lost("UpdateSandboxWithinQuota(resume)", err)
	woken2 := woken
	woken2.State = store.StateRunning
	_, err = f.UpdateSandboxWithinQuota(ctx, woken2, store.Quota{})
	lost("UpdateSandboxWithinQuota(live to live)", err)
	lost("DeleteSandbox()", f.DeleteSandbox(ctx, "t1", sb.ID))
	lost("DeleteSnapshot()", f.DeleteSnapshot(ctx, "t1", sn.ID))

	// Nothing was written.
	for _, want := range []store.Sandbox{sb, woken, asleep} {
		if got, err := s.Sandbox(ctx, "t1", want.ID); err != nil || !cmp.Equal(got, want) {
			t.Errorf("Sandbox(%s) after fenced-off writes = %+v, %v; want %+v", want.ID, got, err, want)
		}
	}
	if got, err := s.Snapshot(ctx, "t1", sn.ID); err != nil || !cmp.Equal(got, sn) {
		t.Errorf("Snapshot() after fenced-off writes = %+v, %v; want %+v", got, err, sn)
	}
	if got, err := s.Template(ctx, "t1", "base", tp.Version); err != nil || !cmp.Equal(got, tp) {
		t.Errorf("Template() after fenced-off writes = %+v, %v; want %+v", got, err, tp)
	}
	if _, err := s.Sandbox(ctx, "t1", nsb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Sandbox(fenced-off create) = %v, want ErrNotFound", err)
	}

	// The new holder writes; once it releases, its lease fences too.
	if _, err := s.Fenced(nl).UpdateSandbox(ctx, sb2); err != nil {
		t.Errorf("Fenced(new holder).UpdateSandbox() = %v", err)
	}
	if err := s.ReleaseLease(ctx, nl); err != nil {
		t.Fatalf("ReleaseLease() = %v", err)
	}
	lost("DeleteSnapshot() after release", s.Fenced(nl).DeleteSnapshot(ctx, "t1", sn.ID))
	// A lease that never existed fences everything off.
	lost("DeleteSnapshot() with no lease", s.Fenced(store.Lease{Name: "nope", Holder: "r1", Token: 1}).DeleteSnapshot(ctx, "t1", sn.ID))
}

func sandboxWith(team string, state store.SandboxState, vcpus int, mem int64) store.Sandbox {
	sb := newSandbox(team)
	sb.State, sb.VCPUs, sb.MemoryMiB = state, vcpus, mem
	return sb
}

func testQuota(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	// Sandboxes in states that are not live do not count.
	for _, st := range store.NotLive {
		if st == "suspended" && !st.Valid() {
			continue // not a state this build knows yet
		}
		mustSandbox(t, s, sandboxWith("t1", st, 8, 8192))
	}
	mustSandbox(t, s, sandboxWith("t2", store.StateRunning, 8, 8192))
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (store.Usage{}) {
		t.Errorf("TeamUsage(t1) with dead sandboxes only = %+v, %v; want zero", u, err)
	}
	q := store.Quota{Sandboxes: 3, VCPUs: 4, MemoryMiB: 4096}
	first, err := s.CreateSandboxWithinQuota(ctx, sandboxWith("t1", store.StateCreating, 2, 1024), q)
	if err != nil {
		t.Fatalf("CreateSandboxWithinQuota(first) = %v", err)
	}
	if got, err := s.Sandbox(ctx, "t1", first.ID); err != nil || !cmp.Equal(got, first) || got.VCPUs != 2 || got.MemoryMiB != 1024 {
		t.Errorf("Sandbox(first) = %+v, %v; want %+v", got, err, first)
	}
	mustSandbox(t, s, sandboxWith("t1", store.StatePaused, 1, 1024)) // paused still holds its VM
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (store.Usage{Sandboxes: 2, VCPUs: 3, MemoryMiB: 2048}) {
		t.Errorf("TeamUsage(t1) = %+v, %v; want 2 sandboxes, 3 vcpus, 2048 MiB", u, err)
	}
	for _, tt := range []struct {
		name  string
		sb    store.Sandbox
		want  string // "" to fit
		limit store.QuotaLimit
	}{
		{"too many vcpus", sandboxWith("t1", store.StateCreating, 2, 0), "team t1 quota: 3 of 4 vcpus in use", store.LimitVCPUs},
		{"too much memory", sandboxWith("t1", store.StateCreating, 1, 2049), "team t1 quota: 2048 of 4096 MiB of memory in use", store.LimitMemory},
		{"fits exactly", sandboxWith("t1", store.StateCreating, 1, 2048), "", ""},
		{"too many sandboxes", sandboxWith("t1", store.StateCreating, 0, 0), "team t1 quota: 3 of 3 sandboxes in use", store.LimitSandboxes},
		{"not live always fits", sandboxWith("t1", store.StateStopped, 100, 100000), "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.CreateSandboxWithinQuota(ctx, tt.sb, q)
			if tt.want == "" {
				if err != nil {
					t.Errorf("CreateSandboxWithinQuota() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CreateSandboxWithinQuota() = %v, want resource exhausted: %q", err, tt.want)
			}
			if qe := (*store.QuotaError)(nil); !errors.As(err, &qe) || qe.Limit != tt.limit {
				t.Errorf("CreateSandboxWithinQuota() = %v, want a *store.QuotaError of limit %q", err, tt.limit)
			}
			if _, err := s.Sandbox(ctx, "t1", tt.sb.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Sandbox(refused) = %v, want ErrNotFound", err)
			}
		})
	}
	// Zero limits are unlimited; other teams are not counted.
	if _, err := s.CreateSandboxWithinQuota(ctx, sandboxWith("t1", store.StateCreating, 64, 1<<20), store.Quota{}); err != nil {
		t.Errorf("CreateSandboxWithinQuota(no limits) = %v", err)
	}
	if _, err := s.CreateSandboxWithinQuota(ctx, sandboxWith("t2", store.StateCreating, 1, 1), store.Quota{Sandboxes: 2}); err != nil {
		t.Errorf("CreateSandboxWithinQuota(t2) = %v", err)
	}

	_, err = s.CreateSandboxWithinQuota(ctx, sandboxWith("nope", store.StateCreating, 1, 1), q)
	wantKind(t, "CreateSandboxWithinQuota(unknown team)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.CreateSandboxWithinQuota(ctx, sandboxWith("t1", store.StateCreating, -1, 1), q)
	wantKind(t, "CreateSandboxWithinQuota(negative vcpus)", err, store.ErrInvalid, errkind.InvalidArgument)
	_, err = s.CreateSandboxWithinQuota(ctx, sandboxWith("t1", store.StateCreating, 1, 1), store.Quota{Sandboxes: -1})
	wantKind(t, "CreateSandboxWithinQuota(negative quota)", err, store.ErrInvalid, errkind.InvalidArgument)
	_, err = s.CreateSandboxWithinQuota(ctx, first, store.Quota{})
	wantKind(t, "CreateSandboxWithinQuota(taken id)", err, store.ErrAlreadyExists, errkind.Conflict)

	// UpdateSandbox keeps what the sandbox counts.
	first.State = store.StateRunning
	first.VCPUs, first.MemoryMiB = 99, 99
	up, err := s.UpdateSandbox(ctx, first)
	if err != nil || up.VCPUs != 2 || up.MemoryMiB != 1024 {
		t.Errorf("UpdateSandbox(changed resources) = %+v, %v; want 2 vcpus, 1024 MiB kept", up, err)
	}
}

func testQuotaConcurrent(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	const n, limit = 40, 10
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		ok      int
		refused int
		other   []error
	)
	for range n {
		wg.Go(func() {
			_, err := s.CreateSandboxWithinQuota(ctx, sandboxWith("t1", store.StateCreating, 1, 256), store.Quota{Sandboxes: limit})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errkind.ResourceExhausted):
				refused++
			default:
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if ok != limit || refused != n-limit || len(other) > 0 {
		t.Errorf("%d concurrent CreateSandboxWithinQuota(limit %d): %d ok, %d refused, errors %v; want %d ok",
			n, limit, ok, refused, other, limit)
	}
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (store.Usage{Sandboxes: limit, VCPUs: limit, MemoryMiB: 256 * limit}) {
		t.Errorf("TeamUsage(t1) = %+v, %v; want %d sandboxes", u, err, limit)
	}
}

// resumed is sb being resumed: its state set to creating.
func resumed(sb store.Sandbox) store.Sandbox {
	sb.State = store.StateCreating
	return sb
}

// wantRefused checks that err is a quota refusal mentioning want and that
// the sandbox was left as before.
func wantRefused(t *testing.T, s store.Store, op string, err error, want string, before store.Sandbox) {
	t.Helper()
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s = %v, want resource exhausted: %q", op, err, want)
	}
	if got, err := s.Sandbox(t.Context(), before.TeamID, before.ID); err != nil || !cmp.Equal(got, before) {
		t.Errorf("Sandbox() after %s = %+v, %v; want unchanged %+v", op, got, err, before)
	}
}

func testQuotaResume(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	live := mustSandbox(t, s, sandboxWith("t1", store.StateRunning, 2, 1024))
	small := mustSandbox(t, s, sandboxWith("t1", store.StateSuspended, 2, 1024))
	other := mustSandbox(t, s, sandboxWith("t1", store.StateSuspended, 1, 1024))
	big := mustSandbox(t, s, sandboxWith("t1", store.StateSuspended, 3, 512))
	mustSandbox(t, s, sandboxWith("t2", store.StateRunning, 8, 8192))
	q := store.Quota{Sandboxes: 2, VCPUs: 4, MemoryMiB: 4096}

	// The resources stored with the sandbox count, whatever sb says.
	claim := resumed(big)
	claim.VCPUs, claim.MemoryMiB = 0, 0
	_, err := s.UpdateSandboxWithinQuota(ctx, claim, q)
	wantRefused(t, s, "UpdateSandboxWithinQuota(resume, too many vcpus)", err, "team t1 quota: 2 of 4 vcpus in use, 3 more requested", big)

	got, err := s.UpdateSandboxWithinQuota(ctx, resumed(small), q)
	if err != nil {
		t.Fatalf("UpdateSandboxWithinQuota(resume, fits exactly) = %v", err)
	}
	if got.State != store.StateCreating || got.Version != small.Version+1 || got.VCPUs != 2 || got.MemoryMiB != 1024 {
		t.Errorf("UpdateSandboxWithinQuota(resume) = %+v, want creating at version %d with 2 vcpus, 1024 MiB", got, small.Version+1)
	}
	if stored, err := s.Sandbox(ctx, "t1", small.ID); err != nil || !cmp.Equal(stored, got) {
		t.Errorf("Sandbox(resumed) = %+v, %v; want %+v", stored, err, got)
	}
	small = got
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (store.Usage{Sandboxes: 2, VCPUs: 4, MemoryMiB: 2048}) {
		t.Errorf("TeamUsage(t1) after resume = %+v, %v; want 2 sandboxes, 4 vcpus, 2048 MiB", u, err)
	}
	_, err = s.UpdateSandboxWithinQuota(ctx, resumed(other), q)
	wantRefused(t, s, "UpdateSandboxWithinQuota(resume, too many sandboxes)", err, "team t1 quota: 2 of 2 sandboxes in use", other)

	// A stale version is a conflict, whether or not the resume would fit.
	stale := resumed(other)
	other.Labels = map[string]string{"note": "still suspended"}
	if other, err = s.UpdateSandbox(ctx, other); err != nil {
		t.Fatalf("setup: UpdateSandbox(labels) = %v", err)
	}
	for _, sq := range []store.Quota{q, {}} {
		_, err = s.UpdateSandboxWithinQuota(ctx, stale, sq)
		wantKind(t, fmt.Sprintf("UpdateSandboxWithinQuota(stale version, quota %+v)", sq), err, store.ErrVersionConflict, errkind.Conflict)
	}
	missing := resumed(sandboxWith("t1", store.StateSuspended, 0, 0))
	_, err = s.UpdateSandboxWithinQuota(ctx, missing, q)
	wantKind(t, "UpdateSandboxWithinQuota(unknown sandbox)", err, store.ErrNotFound, errkind.NotFound)
	theirs := resumed(other)
	theirs.TeamID = "t2"
	_, err = s.UpdateSandboxWithinQuota(ctx, theirs, store.Quota{})
	wantKind(t, "UpdateSandboxWithinQuota(another team's sandbox)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.UpdateSandboxWithinQuota(ctx, resumed(other), store.Quota{Sandboxes: -1})
	wantKind(t, "UpdateSandboxWithinQuota(negative quota)", err, store.ErrInvalid, errkind.InvalidArgument)

	// Updates that do not make a sandbox live again are not checked, even
	// with the team over its quota.
	full := store.Quota{Sandboxes: 1, VCPUs: 1, MemoryMiB: 1}
	for _, tt := range []struct {
		name string
		sb   store.Sandbox
		to   store.SandboxState
	}{
		{"live to live", small, store.StateRunning},
		{"live to not live", live, store.StateSuspended},
		{"not live to not live", other, store.StateDeleted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := tt.sb
			up.State = tt.to
			got, err := s.UpdateSandboxWithinQuota(ctx, up, full)
			if err != nil || got.State != tt.to || got.Version != tt.sb.Version+1 {
				t.Errorf("UpdateSandboxWithinQuota(%s -> %s) = %+v, %v; want %s at version %d",
					tt.sb.State, tt.to, got, err, tt.to, tt.sb.Version+1)
			}
		})
	}
	if u, err := s.TeamUsage(ctx, "t1"); err != nil || u != (store.Usage{Sandboxes: 1, VCPUs: 2, MemoryMiB: 1024}) {
		t.Errorf("TeamUsage(t1) at the end = %+v, %v; want 1 sandbox, 2 vcpus, 1024 MiB", u, err)
	}
}

func testQuotaResumeConcurrent(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	// Each team has room for one more sandbox, and six candidates start
	// together for it: two resumes of each of two suspended sandboxes,
	// and two creates.
	const teams = 10
	q := store.Quota{Sandboxes: 2}
	type op struct {
		team, id string // id is "" for a create
		run      func() error
	}
	var (
		ops       []op
		suspended []store.Sandbox
	)
	for i := range teams {
		team := fmt.Sprintf("t%d", i)
		mustTeam(t, s, team)
		mustSandbox(t, s, sandboxWith(team, store.StateRunning, 1, 256))
		for range 2 {
			sb := mustSandbox(t, s, sandboxWith(team, store.StateSuspended, 1, 256))
			suspended = append(suspended, sb)
			for range 2 {
				ops = append(ops, op{team, sb.ID, func() error {
					_, err := s.UpdateSandboxWithinQuota(ctx, resumed(sb), q)
					return err
				}})
			}
		}
		for range 2 {
			ops = append(ops, op{team, "", func() error {
				_, err := s.CreateSandboxWithinQuota(ctx, sandboxWith(team, store.StateCreating, 1, 256), q)
				return err
			}})
		}
	}
	var (
		wg        sync.WaitGroup
		begin     = make(chan struct{})
		mu        sync.Mutex
		ok        = map[string]int{} // by team, and by sandbox ID for resumes
		conflicts = map[string]int{} // by sandbox ID
		other     []error
	)
	for _, o := range ops {
		wg.Go(func() {
			<-begin
			err := o.run()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok[o.team]++
				if o.id != "" {
					ok[o.id]++
				}
			case errors.Is(err, errkind.ResourceExhausted):
			case errors.Is(err, store.ErrVersionConflict) && o.id != "":
				conflicts[o.id]++
			default:
				other = append(other, err)
			}
		})
	}
	close(begin)
	wg.Wait()
	if len(other) > 0 {
		t.Errorf("concurrent resumes and creates: errors %v, want none but refusals and version conflicts", other)
	}
	for i := range teams {
		team := fmt.Sprintf("t%d", i)
		if ok[team] != 1 {
			t.Errorf("team %s: %d of 6 concurrent resumes and creates ok, want 1 (room for one)", team, ok[team])
		}
		if u, err := s.TeamUsage(ctx, team); err != nil || u != (store.Usage{Sandboxes: 2, VCPUs: 2, MemoryMiB: 512}) {
			t.Errorf("TeamUsage(%s) = %+v, %v; want 2 sandboxes", team, u, err)
		}
	}
	// A sandbox resumes once; its other resume conflicts only with that.
	for _, sb := range suspended {
		if ok[sb.ID] > 1 || conflicts[sb.ID] > 0 && ok[sb.ID] != 1 {
			t.Errorf("resumes of %s: %d ok, %d conflicts; want at most one ok, conflicts only after it", sb.ID, ok[sb.ID], conflicts[sb.ID])
		}
		got, err := s.Sandbox(ctx, sb.TeamID, sb.ID)
		if err != nil || store.Live(got.State) != (ok[sb.ID] == 1) {
			t.Errorf("Sandbox(%s) = %+v, %v; want live only if resumed", sb.ID, got, err)
		}
	}
}

func testWorkerProtocol(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	hb := store.StoredTime(time.Now())
	w1 := store.Worker{ID: "w1", Address: "10.0.0.1:7000", VCPUs: 8, MemoryMiB: 32768, LastHeartbeat: hb,
		Protocol: 3, Capabilities: json.RawMessage(`{"vmm":["firecracker"],"pvm":true}`)}
	w2 := store.Worker{ID: "w2", Address: "10.0.0.2:7000", VCPUs: 8, MemoryMiB: 32768, LastHeartbeat: hb}
	for _, w := range []store.Worker{w1, w2} {
		if err := s.UpsertWorker(ctx, w); err != nil {
			t.Fatalf("UpsertWorker(%s) = %v", w.ID, err)
		}
	}
	got, err := s.ListWorkers(ctx)
	if err != nil {
		t.Fatalf("ListWorkers() = %v", err)
	}
	if diff := cmp.Diff([]store.Worker{w1, w2}, got); diff != "" {
		t.Errorf("ListWorkers() (-want +got):\n%s", diff)
	}
	if err := s.DeleteWorker(ctx, "w1"); err != nil {
		t.Fatalf("DeleteWorker(w1) = %v", err)
	}
	err = s.DeleteWorker(ctx, "w1")
	wantKind(t, "DeleteWorker(w1) twice", err, store.ErrNotFound, errkind.NotFound)
	if got, err := s.ListWorkers(ctx); err != nil || !cmp.Equal(got, []store.Worker{w2}, cmpopts.EquateEmpty()) {
		t.Errorf("ListWorkers() after delete = %+v, %v; want only w2", got, err)
	}
	for _, w := range []store.Worker{
		{ID: "w3", Address: "a", LastHeartbeat: hb, Protocol: -1},
		{ID: "w3", Address: "a", LastHeartbeat: hb, Capabilities: json.RawMessage(`{`)},
		{ID: "w3", Address: "a", LastHeartbeat: hb, Capabilities: json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`)},
	} {
		wantKind(t, fmt.Sprintf("UpsertWorker(%.60v)", w), s.UpsertWorker(ctx, w), store.ErrInvalid, errkind.InvalidArgument)
	}
}
