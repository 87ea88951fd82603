package storetest

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/store"
)

func newEgressLog(team, sandboxID, logID string) store.EgressLog {
	return store.EgressLog{TeamID: team, SandboxID: sandboxID, LogID: logID,
		Data: []byte("log:" + team + "/" + sandboxID + "/" + logID)}
}

func mustEgressLog(t *testing.T, s store.Store, seg store.EgressLog) store.EgressLog {
	t.Helper()
	got, err := s.PutEgressLog(t.Context(), seg)
	if err != nil {
		t.Fatalf("setup: PutEgressLog(%s, %s, %s): %v", seg.TeamID, seg.SandboxID, seg.LogID, err)
	}
	return got
}

// inListOrder sorts segs as EgressLogs returns them: oldest Created
// first, then bytewise by LogID. The store's clock sets Created, so the
// tests derive the order they want from the Created values they got back
// (two puts may fall in the same microsecond).
func inListOrder(segs []store.EgressLog) []store.EgressLog {
	segs = slices.Clone(segs)
	slices.SortStableFunc(segs, func(a, b store.EgressLog) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.LogID, b.LogID)
	})
	return segs
}

// logIDs names each segment.
func logIDs(segs []store.EgressLog) []string {
	var ids []string
	for _, seg := range segs {
		ids = append(ids, seg.LogID)
	}
	return ids
}

func testEgressLogCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := store.NewSandboxID()

	in := newEgressLog("t1", sb, "w2/slot-7/run-3")
	in.Data = []byte{0x1f, 0x8b, 0, 0xff} // binary, kept byte for byte
	first, err := s.PutEgressLog(ctx, in)
	if err != nil {
		t.Fatalf("PutEgressLog() = %v", err)
	}
	want := in
	want.Created = first.Created
	if diff := cmp.Diff(want, first); diff != "" || first.Created.IsZero() {
		t.Errorf("PutEgressLog() = created %v (-want +got):\n%s", first.Created, diff)
	}
	// The store keeps its own copy of the caller's Data.
	in.Data[0] = 9
	first.Data[1] = 9
	first.Data = []byte{0x1f, 0x8b, 0, 0xff}

	// Put later, but bytewise before the first: the list is by Created
	// before LogID.
	segs := []store.EgressLog{first}
	for _, id := range []string{"w1/slot-2/run-2", "w1/slot-2/run-1", "A", "~"} {
		segs = append(segs, mustEgressLog(t, s, newEgressLog("t1", sb, id)))
	}
	for i := 1; i < len(segs); i++ {
		if segs[i].Created.Before(segs[i-1].Created) {
			t.Errorf("PutEgressLog(%s).Created = %v, before the earlier PutEgressLog(%s)'s %v",
				segs[i].LogID, segs[i].Created, segs[i-1].LogID, segs[i-1].Created)
		}
	}
	// Another sandbox's segment of the same LogID is another record.
	other := mustEgressLog(t, s, newEgressLog("t1", store.NewSandboxID(), first.LogID))

	got, err := s.EgressLogs(ctx, "t1", sb)
	if err != nil {
		t.Fatalf("EgressLogs(t1, %s) = %v", sb, err)
	}
	if diff := cmp.Diff(inListOrder(segs), got); diff != "" {
		t.Errorf("EgressLogs(t1, %s) (-want +got):\n%s", sb, diff)
	}

	// A retry replaces the segment's Data and keeps its Created.
	retry := newEgressLog("t1", sb, "A")
	retry.Data = []byte("retried, longer than before")
	replaced, err := s.PutEgressLog(ctx, retry)
	if err != nil {
		t.Fatalf("PutEgressLog(A again) = %v", err)
	}
	segs[3].Data = retry.Data
	if diff := cmp.Diff(segs[3], replaced); diff != "" {
		t.Errorf("PutEgressLog(A again) (-want +got):\n%s", diff)
	}
	got, err = s.EgressLogs(ctx, "t1", sb)
	if err != nil {
		t.Fatalf("EgressLogs(t1, %s) after replace = %v", sb, err)
	}
	if diff := cmp.Diff(inListOrder(segs), got); diff != "" {
		t.Errorf("EgressLogs(t1, %s) after replace (-want +got):\n%s", sb, diff)
	}
	if got, err := s.EgressLogs(ctx, "t1", other.SandboxID); err != nil {
		t.Errorf("EgressLogs(t1, %s) = %v", other.SandboxID, err)
	} else if diff := cmp.Diff([]store.EgressLog{other}, got); diff != "" {
		t.Errorf("EgressLogs(t1, %s) after a replace in %s (-want +got):\n%s", other.SandboxID, sb, diff)
	}

	// Empty Data is a segment too, and comes back nil.
	since := store.StoredTime(time.Now())
	sb2 := store.NewSandboxID()
	for _, data := range [][]byte{{}, nil} {
		seg := store.EgressLog{TeamID: "t1", SandboxID: sb2, LogID: "empty", Data: data}
		got, err := s.PutEgressLog(ctx, seg)
		if err != nil {
			t.Fatalf("PutEgressLog(data %#v) = %v", data, err)
		}
		if got.Data != nil || got.Created.Before(since) {
			t.Errorf("PutEgressLog(data %#v) = data %#v, created %v; want nil data, created from %v on", data, got.Data, got.Created, since)
		}
	}
	if got, err := s.EgressLogs(ctx, "t1", sb2); err != nil || len(got) != 1 || got[0].Data != nil {
		t.Errorf("EgressLogs(t1, %s) = %+v, %v; want one segment with nil data", sb2, got, err)
	}

	_, err = s.PutEgressLog(ctx, newEgressLog("nosuch", sb, "w1/slot-1/run-1"))
	wantKind(t, "PutEgressLog(unknown team)", err, store.ErrNotFound, errkind.NotFound)
	for _, q := range []struct{ team, sb string }{{"nosuch", sb}, {"t1", store.NewSandboxID()}, {"t1", "not a sandbox"}} {
		if got, err := s.EgressLogs(ctx, q.team, q.sb); err != nil || len(got) != 0 {
			t.Errorf("EgressLogs(%s, %s) = %v, %v; want none", q.team, q.sb, logIDs(got), err)
		}
	}
}

func testEgressLogTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "a")
	mustTeam(t, s, "b")
	sb := store.NewSandboxID()
	seg := mustEgressLog(t, s, newEgressLog("a", sb, "w1/slot-1/run-1"))

	if got, err := s.EgressLogs(ctx, "b", sb); err != nil || len(got) != 0 {
		t.Errorf("EgressLogs(b, %s) = %v, %v; want none", sb, logIDs(got), err)
	}
	// Team b's segment of the same sandbox and LogID is another record:
	// it neither replaces nor shows team a's.
	in := newEgressLog("b", sb, seg.LogID)
	in.Data = []byte("team b's")
	own := mustEgressLog(t, s, in)
	for _, want := range []store.EgressLog{seg, own} {
		got, err := s.EgressLogs(ctx, want.TeamID, sb)
		if err != nil {
			t.Fatalf("EgressLogs(%s, %s) = %v", want.TeamID, sb, err)
		}
		if diff := cmp.Diff([]store.EgressLog{want}, got); diff != "" {
			t.Errorf("EgressLogs(%s, %s) (-want +got):\n%s", want.TeamID, sb, diff)
		}
	}
}

func testEgressLogDeleteBefore(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	sb1, sb2 := store.NewSandboxID(), store.NewSandboxID()
	if n, err := s.DeleteEgressLogsBefore(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("DeleteEgressLogsBefore(now+1h) of none = %d, %v; want 0", n, err)
	}

	var left []store.EgressLog
	for i, p := range []struct{ team, sb string }{{"t1", sb1}, {"t2", sb2}, {"t1", sb1}, {"t1", sb2}, {"t2", sb1}} {
		left = append(left, mustEgressLog(t, s, newEgressLog(p.team, p.sb, fmt.Sprintf("run-%d", i))))
	}
	first, second, last := left[0].Created, left[1].Created, left[len(left)-1].Created
	stored := func() []store.EgressLog {
		t.Helper()
		all := []store.EgressLog{} // as left is once all are gone
		for _, team := range []string{"t1", "t2"} {
			for _, sb := range []string{sb1, sb2} {
				got, err := s.EgressLogs(ctx, team, sb)
				if err != nil {
					t.Fatalf("EgressLogs(%s, %s) = %v", team, sb, err)
				}
				all = append(all, got...)
			}
		}
		slices.SortFunc(all, func(a, b store.EgressLog) int { return strings.Compare(a.LogID, b.LogID) })
		return all
	}

	for _, step := range []struct {
		name string
		cut  time.Time
	}{
		{"long ago", first.Add(-24 * time.Hour)},
		{"the first's Created", first},                           // before, not at
		{"just after the second's", second.Add(time.Nanosecond)}, // finer than the stored microseconds
		{"the last's Created", last},
		{"the future", time.Now().Add(time.Hour)},
	} {
		var gone []string
		left = slices.DeleteFunc(left, func(seg store.EgressLog) bool {
			if seg.Created.Before(step.cut) {
				gone = append(gone, seg.LogID)
				return true
			}
			return false
		})
		op := fmt.Sprintf("DeleteEgressLogsBefore(%s)", step.name)
		n, err := s.DeleteEgressLogsBefore(ctx, step.cut)
		if err != nil {
			t.Fatalf("%s = %v", op, err)
		}
		if n != len(gone) {
			t.Errorf("%s = %d, want %d (%v)", op, n, len(gone), gone)
		}
		if diff := cmp.Diff(left, stored()); diff != "" {
			t.Errorf("segments after %s (-want +got):\n%s", op, diff)
		}
	}
	if len(left) != 0 {
		t.Errorf("segments after DeleteEgressLogsBefore(the future) = %v, want none", logIDs(left))
	}
}

func testEgressLogPersistence(t *testing.T, h Harness) {
	ctx := t.Context()
	loc := h.New(t)
	s, err := h.Open(ctx, loc)
	if err != nil {
		t.Fatalf("setup: open: %v", err)
	}
	mustTeam(t, s, "t1")
	sb := store.NewSandboxID()
	in := newEgressLog("t1", sb, "w1/slot-3/run-1")
	in.Data = bytes.Repeat([]byte{0xa5, 0, 0x5a}, 1<<18) // spans many database pages
	big := mustEgressLog(t, s, in)
	retried := mustEgressLog(t, s, newEgressLog("t1", sb, "w2/slot-1/run-2"))
	in = newEgressLog("t1", sb, retried.LogID)
	in.Data = []byte("second copy")
	retried = mustEgressLog(t, s, in)
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}

	s = open(t, h, loc)
	got, err := s.EgressLogs(ctx, "t1", sb)
	if err != nil {
		t.Fatalf("EgressLogs(t1, %s) after reopen = %v", sb, err)
	}
	// bytes.Equal: cmp would compare the large Data byte by byte, slowly.
	if diff := cmp.Diff(inListOrder([]store.EgressLog{big, retried}), got, cmp.Comparer(bytes.Equal)); diff != "" {
		t.Errorf("EgressLogs(t1, %s) after reopen (-want +got):\n%s", sb, diff)
	}
}

func testEgressLogBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := store.NewSandboxID()
	existing := mustEgressLog(t, s, newEgressLog("t1", sb, "keep"))
	bad := []struct {
		name string
		f    func(*store.EgressLog)
	}{
		{"empty team", func(e *store.EgressLog) { e.TeamID = "" }},
		{"team with slash", func(e *store.EgressLog) { e.TeamID = "a/b" }},
		{"empty sandbox", func(e *store.EgressLog) { e.SandboxID = "" }},
		{"sandbox without prefix", func(e *store.EgressLog) { e.SandboxID = strings.TrimPrefix(sb, "sbx_") }},
		{"upper case sandbox", func(e *store.EgressLog) { e.SandboxID = "sbx_" + strings.ToUpper(sb[4:]) }},
		{"snapshot id as sandbox", func(e *store.EgressLog) { e.SandboxID = store.NewSnapshotID() }},
		{"empty log id", func(e *store.EgressLog) { e.LogID = "" }},
		{"log id too long", func(e *store.EgressLog) { e.LogID = strings.Repeat("l", 201) }},
		{"log id with space", func(e *store.EgressLog) { e.LogID = "w1 run" }},
		{"log id with tab", func(e *store.EgressLog) { e.LogID = "w1\trun" }},
		{"log id with newline", func(e *store.EgressLog) { e.LogID = "keep\n" }},
		{"log id with nul", func(e *store.EgressLog) { e.LogID = "keep\x00" }},
		{"log id with del", func(e *store.EgressLog) { e.LogID = "keep\x7f" }},
		{"log id not ascii", func(e *store.EgressLog) { e.LogID = "kéep" }},
		{"data too large", func(e *store.EgressLog) { e.Data = make([]byte, store.MaxEgressLogBytes+1) }},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			// A replacement of existing, but for the bad field.
			seg := newEgressLog("t1", sb, "keep")
			seg.Data = []byte("replaced")
			b.f(&seg)
			_, err := s.PutEgressLog(ctx, seg)
			wantKind(t, "PutEgressLog("+b.name+")", err, store.ErrInvalid, errkind.InvalidArgument)
		})
	}
	// The limits themselves are fine.
	var id []byte
	for c := byte(0x21); c <= 0x7e; c++ {
		id = append(id, c)
	}
	id = append(id, bytes.Repeat([]byte{'~'}, 200-len(id))...)
	ok := mustEgressLog(t, s, store.EgressLog{TeamID: "t1", SandboxID: sb, LogID: string(id)})

	got, err := s.EgressLogs(ctx, "t1", sb)
	if err != nil {
		t.Fatalf("EgressLogs(t1, %s) = %v", sb, err)
	}
	if diff := cmp.Diff(inListOrder([]store.EgressLog{existing, ok}), got); diff != "" {
		t.Errorf("EgressLogs(t1, %s) after bad input (-want +got):\n%s", sb, diff)
	}
	// Nothing was written anywhere else either.
	if n, err := s.DeleteEgressLogsBefore(ctx, time.Now().Add(time.Hour)); err != nil || n != 2 {
		t.Errorf("DeleteEgressLogsBefore(now+1h) after bad input = %d, %v; want 2", n, err)
	}
}
