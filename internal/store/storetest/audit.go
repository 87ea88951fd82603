package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"space/internal/audit"
	"space/internal/errkind"
	"space/internal/store"
)

func newAuditEntry(team, route string, i int) store.AuditEntry {
	e := store.AuditEntry{
		RequestID: fmt.Sprintf("req_%d", i), KeyID: "key_" + team, TeamID: team, Source: "127.0.0.1:4711",
		Method: "POST", Route: route, Targets: map[string]string{"id": fmt.Sprintf("sbx_%d", i)},
		Code: 200, Outcome: store.AuditOK,
	}
	if team == "" {
		e.KeyID, e.Code, e.Outcome, e.Targets = "", 401, store.AuditUnauthenticated, nil
	}
	return e
}

func mustAudit(t *testing.T, s store.Store, e store.AuditEntry) store.AuditEntry {
	t.Helper()
	got, err := s.AppendAudit(t.Context(), e)
	if err != nil {
		t.Fatalf("setup: AppendAudit(%s %s): %v", e.Method, e.Route, err)
	}
	return got
}

func listAudit(t *testing.T, s store.Store, q store.AuditQuery) []store.AuditEntry {
	t.Helper()
	got, err := s.ListAudit(t.Context(), q)
	if err != nil {
		t.Fatalf("ListAudit(%+v) = %v", q, err)
	}
	return got
}

func seqs(es []store.AuditEntry) []int64 {
	out := []int64{}
	for _, e := range es {
		out = append(out, e.Seq)
	}
	return out
}

// verifyAudit checks the whole stored log from the stored anchor and
// returns what it covered.
func verifyAudit(t *testing.T, s store.Store) (audit.Result, error) {
	t.Helper()
	a, err := s.AuditAnchor(t.Context())
	if err != nil {
		t.Fatalf("AuditAnchor() = %v", err)
	}
	return audit.Verify(listAudit(t, s, store.AuditQuery{}), a)
}

func testAuditAppendList(t *testing.T, h Harness) {
	s := fresh(t, h)
	if got := listAudit(t, s, store.AuditQuery{}); len(got) != 0 {
		t.Errorf("ListAudit() of a new store = %v, want none", seqs(got))
	}
	if a, err := s.AuditAnchor(t.Context()); err != nil || a.Seq != 0 || len(a.Hash) != 0 || !a.Time.IsZero() {
		t.Errorf("AuditAnchor() of a new store = %+v, %v; want the zero anchor", a, err)
	}

	before := store.StoredTime(time.Now())
	var all []store.AuditEntry
	for i, team := range []string{"t1", "t2", "", "t1", "t1", "t2"} {
		in := newAuditEntry(team, "/v1/sandboxes/{id}", i)
		in.Seq, in.Hash, in.Prev = 99, []byte("caller's"), []byte("ignored") // the store sets them
		got := mustAudit(t, s, in)
		want := in
		want.Seq, want.Time, want.Prev, want.Hash = int64(i+1), got.Time, []byte{}, got.Hash
		if i > 0 {
			want.Prev = all[i-1].Hash
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("AppendAudit(#%d) (-want +got):\n%s", i, diff)
		}
		if got.Time.Before(before) || (i > 0 && got.Time.Before(all[i-1].Time)) {
			t.Errorf("AppendAudit(#%d).Time = %v, want from %v on", i, got.Time, before)
		}
		if len(got.Hash) != 32 {
			t.Errorf("AppendAudit(#%d).Hash = %x, want 32 bytes", i, got.Hash)
		}
		all = append(all, got)
	}
	// The store keeps its own copy of the caller's targets.
	all[0].Targets["id"] = "changed"
	all[0].Targets["id"] = "sbx_0"

	if diff := cmp.Diff(all, listAudit(t, s, store.AuditQuery{})); diff != "" {
		t.Errorf("ListAudit() (-want +got):\n%s", diff)
	}
	if r, err := verifyAudit(t, s); err != nil || r.Entries != 6 || r.First != 1 || r.Last != 6 {
		t.Errorf("Verify(stored log) = %+v, %v; want 6 entries from 1 to 6", r, err)
	}

	for _, q := range []struct {
		name string
		q    store.AuditQuery
		want []int64
	}{
		{"team t1", store.AuditQuery{TeamID: "t1"}, []int64{1, 4, 5}},
		{"team t2 after 2", store.AuditQuery{TeamID: "t2", After: 2}, []int64{6}},
		{"after 3", store.AuditQuery{After: 3}, []int64{4, 5, 6}},
		{"limit 2", store.AuditQuery{Limit: 2}, []int64{1, 2}},
		{"after 2 limit 2", store.AuditQuery{After: 2, Limit: 2}, []int64{3, 4}},
		{"after the last", store.AuditQuery{After: 6}, []int64{}},
		{"unknown team", store.AuditQuery{TeamID: "nosuch"}, []int64{}},
		{"since the third", store.AuditQuery{Since: all[2].Time}, entriesFrom(all, all[2].Time, time.Time{})},
		{"until the third", store.AuditQuery{Until: all[2].Time}, entriesFrom(all, time.Time{}, all[2].Time)},
		{"since and until", store.AuditQuery{Since: all[1].Time, Until: all[4].Time.Add(time.Nanosecond)}, entriesFrom(all, all[1].Time, all[4].Time.Add(time.Nanosecond))},
		{"since the future", store.AuditQuery{Since: time.Now().Add(time.Hour)}, []int64{}},
	} {
		if diff := cmp.Diff(q.want, seqs(listAudit(t, s, q.q))); diff != "" {
			t.Errorf("ListAudit(%s) seqs (-want +got):\n%s", q.name, diff)
		}
	}
}

// entriesFrom returns the seqs of the entries with since <= Time < until
// (a zero bound is none).
func entriesFrom(all []store.AuditEntry, since, until time.Time) []int64 {
	out := []int64{}
	for _, e := range all {
		if (since.IsZero() || !e.Time.Before(since)) && (until.IsZero() || e.Time.Before(until)) {
			out = append(out, e.Seq)
		}
	}
	return out
}

func testAuditConcurrent(t *testing.T, h Harness) {
	loc := h.New(t)
	// Two stores on one database, as two replicas: their appends make
	// one chain.
	stores := []store.Store{open(t, h, loc)}
	if s2, err := h.Open(t.Context(), loc); err == nil {
		t.Cleanup(func() { s2.Close() })
		stores = append(stores, s2)
	} else if !errors.Is(err, errkind.FailedPrecondition) { // SQLite: one control plane per file
		t.Fatalf("setup: second open: %v", err)
	}
	const writers, each = 8, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		s := stores[w%len(stores)]
		wg.Go(func() {
			for i := range each {
				if _, err := s.AppendAudit(t.Context(), newAuditEntry("t1", "/v1/sandboxes", w*each+i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("AppendAudit() = %v", err)
	}
	r, err := verifyAudit(t, stores[0])
	if err != nil || r.Entries != writers*each || r.First != 1 || r.Last != writers*each {
		t.Errorf("Verify(log of concurrent appends) = %+v, %v; want %d entries from 1", r, err, writers*each)
	}
	// Every append is in it once.
	seen := map[string]bool{}
	for _, e := range listAudit(t, stores[0], store.AuditQuery{}) {
		if seen[e.RequestID] {
			t.Errorf("request %s appended twice", e.RequestID)
		}
		seen[e.RequestID] = true
	}
	if len(seen) != writers*each {
		t.Errorf("log holds %d requests, want %d", len(seen), writers*each)
	}
}

func testAuditPrune(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	if n, err := s.PruneAuditBefore(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("PruneAuditBefore(now+1h) of an empty log = %d, %v; want 0", n, err)
	}
	var all []store.AuditEntry
	for i := range 6 {
		all = append(all, mustAudit(t, s, newAuditEntry("t1", "/v1/sandboxes", i)))
	}
	if n, err := s.PruneAuditBefore(ctx, all[0].Time); err != nil || n != 0 {
		t.Errorf("PruneAuditBefore(the first's time) = %d, %v; want 0", n, err)
	}
	// Cut just after the third: the entries before it go (those at the
	// same microsecond as the third included).
	cut := all[2].Time.Add(time.Nanosecond)
	gone := entriesFrom(all, time.Time{}, cut)
	n, err := s.PruneAuditBefore(ctx, cut)
	if err != nil || n != len(gone) {
		t.Fatalf("PruneAuditBefore(after the third) = %d, %v; want %d", n, err, len(gone))
	}
	last := all[len(gone)-1]
	a, err := s.AuditAnchor(ctx)
	if want := (store.AuditAnchor{Seq: last.Seq, Hash: last.Hash, Time: last.Time}); err != nil || !cmp.Equal(want, a) {
		t.Errorf("AuditAnchor() after prune = %+v, %v; want %+v", a, err, want)
	}
	if diff := cmp.Diff(seqs(all[len(gone):]), seqs(listAudit(t, s, store.AuditQuery{}))); diff != "" {
		t.Errorf("ListAudit() after prune (-want +got):\n%s", diff)
	}
	// What is left verifies from the anchor, and so does what comes next.
	all = append(all, mustAudit(t, s, newAuditEntry("t2", "/v1/secrets", 7)))
	if r, err := verifyAudit(t, s); err != nil || r.First != last.Seq+1 || r.Last != 7 {
		t.Errorf("Verify() after prune = %+v, %v; want from %d to 7", r, err, last.Seq+1)
	}
	// Without the anchor, the first entry left does not follow.
	if _, err := audit.Verify(listAudit(t, s, store.AuditQuery{}), store.AuditAnchor{}); !errors.Is(err, audit.ErrBroken) {
		t.Errorf("Verify(pruned log, zero anchor) = %v, want %v", err, audit.ErrBroken)
	}

	// Everything goes: the anchor is the head, and the next entry chains
	// on from it.
	n, err = s.PruneAuditBefore(ctx, time.Now().Add(time.Hour))
	if err != nil || n != len(all)-len(gone) {
		t.Errorf("PruneAuditBefore(now+1h) = %d, %v; want %d", n, err, len(all)-len(gone))
	}
	if a, err := s.AuditAnchor(ctx); err != nil || a.Seq != 7 || !cmp.Equal(a.Hash, all[6].Hash) {
		t.Errorf("AuditAnchor() after pruning all = %+v, %v; want seq 7", a, err)
	}
	next := mustAudit(t, s, newAuditEntry("t1", "/v1/sandboxes", 8))
	if next.Seq != 8 || !cmp.Equal(next.Prev, all[6].Hash) {
		t.Errorf("AppendAudit() after pruning all = seq %d prev %x, want seq 8 prev %x", next.Seq, next.Prev, all[6].Hash)
	}
	if r, err := verifyAudit(t, s); err != nil || r.Entries != 1 {
		t.Errorf("Verify() after pruning all and one append = %+v, %v; want 1 entry", r, err)
	}
}

func testAuditPersistence(t *testing.T, h Harness) {
	ctx := t.Context()
	loc := h.New(t)
	s, err := h.Open(ctx, loc)
	if err != nil {
		t.Fatalf("setup: open: %v", err)
	}
	var all []store.AuditEntry
	for i := range 4 {
		all = append(all, mustAudit(t, s, newAuditEntry("t1", "/v1/sandboxes/{id}", i)))
	}
	if _, err := s.PruneAuditBefore(ctx, all[0].Time.Add(time.Nanosecond)); err != nil {
		t.Fatalf("PruneAuditBefore() = %v", err)
	}
	anchor, err := s.AuditAnchor(ctx)
	if err != nil {
		t.Fatalf("AuditAnchor() = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}

	s = open(t, h, loc)
	got := listAudit(t, s, store.AuditQuery{})
	kept := entriesFrom(all, all[0].Time.Add(time.Nanosecond), time.Time{})
	if diff := cmp.Diff(kept, seqs(got)); diff != "" {
		t.Errorf("ListAudit() after reopen (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(all[len(all)-len(got):], got); diff != "" {
		t.Errorf("ListAudit() after reopen (-want +got):\n%s", diff)
	}
	if a, err := s.AuditAnchor(ctx); err != nil || !cmp.Equal(anchor, a) {
		t.Errorf("AuditAnchor() after reopen = %+v, %v; want %+v", a, err, anchor)
	}
	if e := mustAudit(t, s, newAuditEntry("t1", "/v1/sandboxes", 9)); e.Seq != 5 {
		t.Errorf("AppendAudit() after reopen = seq %d, want 5", e.Seq)
	}
	if _, err := verifyAudit(t, s); err != nil {
		t.Errorf("Verify() after reopen = %v", err)
	}
}

func testAuditBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	first := mustAudit(t, s, newAuditEntry("t1", "/v1/sandboxes", 0))
	bad := []struct {
		name string
		f    func(*store.AuditEntry)
	}{
		{"no method", func(e *store.AuditEntry) { e.Method = "" }},
		{"no route", func(e *store.AuditEntry) { e.Route = "" }},
		{"route too long", func(e *store.AuditEntry) { e.Route = "/" + strings.Repeat("r", 256) }},
		{"source with newline", func(e *store.AuditEntry) { e.Source = "1.2.3.4\n" }},
		{"request id with nul", func(e *store.AuditEntry) { e.RequestID = "req\x00" }},
		{"team not utf-8", func(e *store.AuditEntry) { e.TeamID = "t\xff" }},
		{"target value not utf-8", func(e *store.AuditEntry) { e.Targets = map[string]string{"id": "\xc3"} }},
		{"empty target name", func(e *store.AuditEntry) { e.Targets = map[string]string{"": "x"} }},
		{"too many targets", func(e *store.AuditEntry) {
			e.Targets = map[string]string{}
			for i := range 17 {
				e.Targets[fmt.Sprint(i)] = "x"
			}
		}},
		{"code 0", func(e *store.AuditEntry) { e.Code = 0 }},
		{"code 600", func(e *store.AuditEntry) { e.Code = 600 }},
		{"unknown outcome", func(e *store.AuditEntry) { e.Outcome = "fine" }},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			e := newAuditEntry("t1", "/v1/sandboxes", 1)
			b.f(&e)
			_, err := s.AppendAudit(ctx, e)
			wantKind(t, "AppendAudit("+b.name+")", err, store.ErrInvalid, errkind.InvalidArgument)
		})
	}
	// Not control characters: the limits and non-ASCII text are fine.
	ok := newAuditEntry("t1", "/v1/sandboxes/{id}", 2)
	ok.Targets = map[string]string{"name": "naïve ☃ <&>", "id": strings.Repeat("x", 256)}
	ok.Source = strings.Repeat("s", 256)
	second := mustAudit(t, s, ok)
	if diff := cmp.Diff([]store.AuditEntry{first, second}, listAudit(t, s, store.AuditQuery{}), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("ListAudit() after bad input (-want +got):\n%s", diff)
	}
	if _, err := verifyAudit(t, s); err != nil {
		t.Errorf("Verify() after bad input = %v", err)
	}
}

// testAuditTamper changes the stored log behind the store's back, as
// someone with the database's credentials could, and checks that
// verification names the entry.
func testAuditTamper(t *testing.T, h Harness) {
	if h.Exec == nil {
		t.Fatalf("harness has no Exec")
	}
	for _, tc := range []struct {
		name, sql string
		seq       int64
	}{
		{"untouched", "", 0},
		{"edited route", `UPDATE audit_log SET route = '/v1/apikeys' WHERE seq = 3`, 3},
		{"edited code", `UPDATE audit_log SET code = 200, outcome = 'ok' WHERE seq = 2`, 2},
		{"edited targets", `UPDATE audit_log SET targets = '{"id":"sbx_other"}' WHERE seq = 4`, 4},
		{"deleted entry", `DELETE FROM audit_log WHERE seq = 3`, 4},
		{"deleted first", `DELETE FROM audit_log WHERE seq = 1`, 2},
		{"renumbered after a delete", `DELETE FROM audit_log WHERE seq = 3; UPDATE audit_log SET seq = seq - 1 WHERE seq > 3`, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loc := h.New(t)
			s := open(t, h, loc)
			var all []store.AuditEntry
			for i := range 5 {
				e := newAuditEntry("t1", "/v1/sandboxes/{id}", i)
				if i == 1 {
					e.Code, e.Outcome = 403, store.AuditRefused
				}
				all = append(all, mustAudit(t, s, e))
			}
			query, seq := tc.sql, tc.seq
			if query != "" {
				if err := h.Exec(t.Context(), loc, query); err != nil {
					t.Fatalf("setup: %s: %v", query, err)
				}
			}
			_, err := verifyAudit(t, s)
			if seq == 0 {
				if err != nil {
					t.Errorf("Verify(untouched log) = %v", err)
				}
				return
			}
			if !errors.Is(err, audit.ErrBroken) || !strings.HasPrefix(err.Error(), fmt.Sprintf("seq %d:", seq)) {
				t.Errorf("Verify(log after %s) = %v, want %v naming seq %d", query, err, audit.ErrBroken, seq)
			}
		})
	}
}
