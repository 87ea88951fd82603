package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/store"
)

func newSnapshot(team, sandboxID string) store.Snapshot {
	return store.Snapshot{
		ID:        store.NewSnapshotID(),
		TeamID:    team,
		SandboxID: sandboxID,
		State:     store.SnapshotCreating,
	}
}

func mustSnapshot(t *testing.T, s store.Store, sn store.Snapshot) store.Snapshot {
	t.Helper()
	got, err := s.CreateSnapshot(t.Context(), sn)
	if err != nil {
		t.Fatalf("setup: CreateSnapshot(%s): %v", sn.ID, err)
	}
	return got
}

func snapshotIDs(sns []store.Snapshot) []string {
	var ids []string
	for _, sn := range sns {
		ids = append(ids, sn.ID)
	}
	return ids
}

func testSnapshotCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")

	// The sandbox need not exist (it may have been deleted since).
	in := newSnapshot("t1", store.NewSandboxID())
	in.Name = "before-upgrade"
	in.WorkerID = "w1"
	in.Meta = json.RawMessage(`{"vmm": "firecracker", "version": "1.7"}`) // kept byte for byte
	created, err := s.CreateSnapshot(ctx, in)
	if err != nil {
		t.Fatalf("CreateSnapshot() = %v", err)
	}
	want := in
	want.Version = 1
	want.Created, want.Updated = created.Created, created.Created
	if diff := cmp.Diff(want, created); diff != "" {
		t.Errorf("CreateSnapshot() (-want +got):\n%s", diff)
	}
	if created.Created.IsZero() || !created.Updated.Equal(created.Created) {
		t.Errorf("CreateSnapshot() = created %v, updated %v; want created == updated != zero", created.Created, created.Updated)
	}

	got, err := s.Snapshot(ctx, "t1", in.ID)
	if err != nil {
		t.Fatalf("Snapshot(%s) = %v", in.ID, err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("Snapshot() after create (-want +got):\n%s", diff)
	}
	got, err = s.SnapshotByName(ctx, "t1", in.Name)
	if err != nil {
		t.Fatalf("SnapshotByName(%s) = %v", in.Name, err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("SnapshotByName() after create (-want +got):\n%s", diff)
	}

	// Unnamed, without meta: Meta comes back nil.
	bare := mustSnapshot(t, s, newSnapshot("t1", in.SandboxID))
	got, err = s.Snapshot(ctx, "t1", bare.ID)
	if err != nil {
		t.Fatalf("Snapshot(%s) = %v", bare.ID, err)
	}
	if diff := cmp.Diff(bare, got); diff != "" {
		t.Errorf("Snapshot(unnamed) (-want +got):\n%s", diff)
	}
	if got.Meta != nil || got.Name != "" {
		t.Errorf("Snapshot(unnamed) = name %q meta %q, want empty name and nil meta", got.Name, got.Meta)
	}

	dup := newSnapshot("t1", in.SandboxID)
	dup.ID = in.ID
	_, err = s.CreateSnapshot(ctx, dup)
	wantKind(t, "CreateSnapshot(duplicate id)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.CreateSnapshot(ctx, newSnapshot("nope", in.SandboxID))
	wantKind(t, "CreateSnapshot(unknown team)", err, store.ErrNotFound, errkind.NotFound)

	upd := created
	upd.State = store.SnapshotReady
	upd.WorkerID = ""
	upd.Manifest = upd.ID
	upd.LogicalBytes = 8 << 30
	upd.NewBytes = 123 << 20
	upd.Meta = nil
	updated, err := s.UpdateSnapshot(ctx, upd)
	if err != nil {
		t.Fatalf("UpdateSnapshot() = %v", err)
	}
	want = upd
	want.Version = 2
	want.Updated = updated.Updated
	if diff := cmp.Diff(want, updated); diff != "" {
		t.Errorf("UpdateSnapshot() (-want +got):\n%s", diff)
	}
	if updated.Updated.Before(created.Updated) {
		t.Errorf("UpdateSnapshot().Updated = %v, before Created %v", updated.Updated, created.Updated)
	}
	got, err = s.Snapshot(ctx, "t1", in.ID)
	if err != nil {
		t.Fatalf("Snapshot(%s) = %v", in.ID, err)
	}
	if diff := cmp.Diff(updated, got); diff != "" {
		t.Errorf("Snapshot() after update (-want +got):\n%s", diff)
	}

	// Name and SandboxID are not among the fields an update replaces.
	rename := updated
	rename.Name = "renamed"
	rename.SandboxID = store.NewSandboxID()
	renamed, err := s.UpdateSnapshot(ctx, rename)
	if err != nil {
		t.Fatalf("UpdateSnapshot(new name) = %v", err)
	}
	if renamed.Name != in.Name || renamed.SandboxID != in.SandboxID || renamed.Version != 3 {
		t.Errorf("UpdateSnapshot(new name) = name %q sandbox %s version %d, want name %q sandbox %s version 3",
			renamed.Name, renamed.SandboxID, renamed.Version, in.Name, in.SandboxID)
	}
	_, err = s.SnapshotByName(ctx, "t1", "renamed")
	wantKind(t, "SnapshotByName(renamed)", err, store.ErrNotFound, errkind.NotFound)

	list, err := s.ListSnapshots(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListSnapshots(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.Snapshot{renamed, bare}, list); diff != "" {
		t.Errorf("ListSnapshots(t1) (-want +got):\n%s", diff)
	}

	if err := s.DeleteSnapshot(ctx, "t1", in.ID); err != nil {
		t.Fatalf("DeleteSnapshot() = %v", err)
	}
	_, err = s.Snapshot(ctx, "t1", in.ID)
	wantKind(t, "Snapshot(deleted)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.SnapshotByName(ctx, "t1", in.Name)
	wantKind(t, "SnapshotByName(deleted)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSnapshot(ctx, "t1", in.ID)
	wantKind(t, "DeleteSnapshot(deleted)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.UpdateSnapshot(ctx, renamed)
	wantKind(t, "UpdateSnapshot(deleted)", err, store.ErrNotFound, errkind.NotFound)
	list, err = s.ListSnapshots(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListSnapshots(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.Snapshot{bare}, list); diff != "" {
		t.Errorf("ListSnapshots(t1) after delete (-want +got):\n%s", diff)
	}
}

func testSnapshotNames(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	sbx := store.NewSandboxID()
	named := func(team, name string) store.Snapshot {
		sn := newSnapshot(team, sbx)
		sn.Name = name
		return sn
	}

	first := mustSnapshot(t, s, named("t1", "golden"))
	_, err := s.CreateSnapshot(ctx, named("t1", "golden"))
	wantKind(t, "CreateSnapshot(t1, taken name)", err, store.ErrAlreadyExists, errkind.Conflict)
	other := mustSnapshot(t, s, named("t2", "golden")) // names are per team
	// Any number of unnamed snapshots.
	mustSnapshot(t, s, named("t1", ""))
	mustSnapshot(t, s, named("t1", ""))

	for _, want := range []store.Snapshot{first, other} {
		got, err := s.SnapshotByName(ctx, want.TeamID, "golden")
		if err != nil {
			t.Fatalf("SnapshotByName(%s, golden) = %v", want.TeamID, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("SnapshotByName(%s, golden) (-want +got):\n%s", want.TeamID, diff)
		}
	}
	_, err = s.SnapshotByName(ctx, "t1", "Golden")
	wantKind(t, "SnapshotByName(Golden)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.SnapshotByName(ctx, "t1", "")
	wantKind(t, "SnapshotByName(empty)", err, store.ErrInvalid, errkind.InvalidArgument)

	// A deleted snapshot's name is free again.
	if err := s.DeleteSnapshot(ctx, "t1", first.ID); err != nil {
		t.Fatalf("DeleteSnapshot(%s) = %v", first.ID, err)
	}
	second := mustSnapshot(t, s, named("t1", "golden"))
	if got, err := s.SnapshotByName(ctx, "t1", "golden"); err != nil || got.ID != second.ID {
		t.Errorf("SnapshotByName(t1, golden) after reuse = %s, %v; want %s", got.ID, err, second.ID)
	}

	// Concurrent creates of one name: exactly one wins.
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = s.CreateSnapshot(t.Context(), named("t2", "race")) })
	}
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, store.ErrAlreadyExists):
			t.Errorf("CreateSnapshot(t2, race) by writer %d = %v, want nil or %v", i, err, store.ErrAlreadyExists)
		}
	}
	if wins != 1 {
		t.Errorf("concurrent CreateSnapshot(t2, race): %d succeeded, want 1", wins)
	}
}

func testSnapshotTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "a")
	mustTeam(t, s, "b")
	in := newSnapshot("a", store.NewSandboxID())
	in.Name = "mine"
	in.NewBytes = 100
	in.Manifest = "m1"
	sn := mustSnapshot(t, s, in)

	_, err := s.Snapshot(ctx, "b", sn.ID)
	wantKind(t, "Snapshot(other team)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.SnapshotByName(ctx, "b", "mine")
	wantKind(t, "SnapshotByName(other team)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSnapshot(ctx, "b", sn.ID)
	wantKind(t, "DeleteSnapshot(other team)", err, store.ErrNotFound, errkind.NotFound)
	steal := sn
	steal.TeamID = "b"
	steal.State = store.SnapshotDeleting
	_, err = s.UpdateSnapshot(ctx, steal)
	wantKind(t, "UpdateSnapshot(other team)", err, store.ErrNotFound, errkind.NotFound)
	for _, sandboxID := range []string{"", sn.SandboxID} {
		if list, err := s.ListSnapshots(ctx, "b", sandboxID); err != nil || len(list) != 0 {
			t.Errorf("ListSnapshots(b, %q) = %d snapshots, %v; want none", sandboxID, len(list), err)
		}
	}
	if n, err := s.TeamSnapshotBytes(ctx, "b"); err != nil || n != 0 {
		t.Errorf("TeamSnapshotBytes(b) = %d, %v; want 0", n, err)
	}
	got, err := s.Snapshot(ctx, "a", sn.ID)
	if err != nil {
		t.Fatalf("Snapshot(a) = %v", err)
	}
	if diff := cmp.Diff(sn, got); diff != "" {
		t.Errorf("Snapshot(a) after other team's attempts (-want +got):\n%s", diff)
	}
}

func testSnapshotVersionConflict(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sn := mustSnapshot(t, s, newSnapshot("t1", store.NewSandboxID()))

	first, second := sn, sn
	first.State = store.SnapshotReady
	second.State = store.SnapshotDeleting
	if _, err := s.UpdateSnapshot(ctx, first); err != nil {
		t.Fatalf("UpdateSnapshot(first) = %v", err)
	}
	_, err := s.UpdateSnapshot(ctx, second)
	wantKind(t, "UpdateSnapshot(stale version)", err, store.ErrVersionConflict, errkind.Conflict)
	got, err := s.Snapshot(ctx, "t1", sn.ID)
	if err != nil {
		t.Fatalf("Snapshot() = %v", err)
	}
	if got.State != store.SnapshotReady || got.Version != 2 {
		t.Errorf("Snapshot() = state %s version %d, want ready version 2", got.State, got.Version)
	}
}

func testSnapshotConcurrentUpdates(t *testing.T, h Harness) {
	const n = 8
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sn := mustSnapshot(t, s, newSnapshot("t1", store.NewSandboxID()))

	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			u := sn
			u.State = store.SnapshotReady
			u.Manifest = fmt.Sprintf("writer-%d", i)
			_, errs[i] = s.UpdateSnapshot(t.Context(), u)
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("UpdateSnapshot by writers %d and %d both succeeded at version 1", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrVersionConflict):
			t.Errorf("UpdateSnapshot by writer %d = %v, want nil or %v", i, err, store.ErrVersionConflict)
		}
	}
	if winner < 0 {
		t.Fatalf("no UpdateSnapshot succeeded")
	}
	got, err := s.Snapshot(t.Context(), "t1", sn.ID)
	if err != nil {
		t.Fatalf("Snapshot() = %v", err)
	}
	if want := fmt.Sprintf("writer-%d", winner); got.Version != 2 || got.Manifest != want {
		t.Errorf("Snapshot() = version %d manifest %q, want version 2 manifest %q", got.Version, got.Manifest, want)
	}
}

func testSnapshotListBySandbox(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	sbxA, sbxB := store.NewSandboxID(), store.NewSandboxID()
	mk := func(team, sandboxID string) string { return mustSnapshot(t, s, newSnapshot(team, sandboxID)).ID }
	a1 := mk("t1", sbxA)
	b1 := mk("t1", sbxB)
	a2 := mk("t1", sbxA)
	other := mk("t2", sbxA) // another team's snapshot of a sandbox with the same ID

	tests := []struct {
		name      string
		team      string
		sandboxID string
		want      []string
	}{
		{"all", "t1", "", []string{a1, b1, a2}},
		{"sandbox a", "t1", sbxA, []string{a1, a2}},
		{"sandbox b", "t1", sbxB, []string{b1}},
		{"no snapshots", "t1", store.NewSandboxID(), nil},
		{"other team", "t2", sbxA, []string{other}},
		{"other team, sandbox b", "t2", sbxB, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := s.ListSnapshots(ctx, tt.team, tt.sandboxID)
			if err != nil {
				t.Fatalf("ListSnapshots(%s, %q) = %v", tt.team, tt.sandboxID, err)
			}
			if diff := cmp.Diff(tt.want, snapshotIDs(list)); diff != "" {
				t.Errorf("ListSnapshots(%s, %q) IDs (-want +got):\n%s", tt.team, tt.sandboxID, diff)
			}
		})
	}
}

func testSnapshotBytes(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	mustTeam(t, s, "empty")
	sbx := store.NewSandboxID()
	mk := func(team string, state store.SnapshotState, newBytes int64) store.Snapshot {
		sn := newSnapshot(team, sbx)
		sn.State, sn.NewBytes, sn.LogicalBytes = state, newBytes, 1<<40 // LogicalBytes is not counted
		return mustSnapshot(t, s, sn)
	}
	mk("t1", store.SnapshotReady, 1<<30)
	creating := mk("t1", store.SnapshotCreating, 0)
	deleting := mk("t1", store.SnapshotDeleting, 5) // counted until the record is deleted
	mk("t2", store.SnapshotReady, 7)

	check := func(step, team string, want int64) {
		t.Helper()
		got, err := s.TeamSnapshotBytes(ctx, team)
		if err != nil || got != want {
			t.Errorf("TeamSnapshotBytes(%s) %s = %d, %v; want %d", team, step, got, err, want)
		}
	}
	check("after create", "t1", 1<<30+5)
	check("after create", "t2", 7)
	check("without snapshots", "empty", 0)
	check("of unknown team", "nope", 0)

	creating.State, creating.NewBytes = store.SnapshotReady, 3<<40
	if _, err := s.UpdateSnapshot(ctx, creating); err != nil {
		t.Fatalf("UpdateSnapshot(%s) = %v", creating.ID, err)
	}
	check("after update", "t1", 1<<30+5+3<<40)
	if err := s.DeleteSnapshot(ctx, "t1", deleting.ID); err != nil {
		t.Fatalf("DeleteSnapshot(%s) = %v", deleting.ID, err)
	}
	check("after delete", "t1", 1<<30+3<<40)
	check("after t1's changes", "t2", 7)
}

func testSnapshotManifests(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	if got, err := s.AllSnapshotManifests(ctx); err != nil || len(got) != 0 {
		t.Errorf("AllSnapshotManifests() of an empty store = %q, %v; want none", got, err)
	}
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	sbx := store.NewSandboxID()
	mk := func(team string, state store.SnapshotState, manifest string) store.Snapshot {
		sn := newSnapshot(team, sbx)
		sn.State, sn.Manifest = state, manifest
		return mustSnapshot(t, s, sn)
	}
	mk("t1", store.SnapshotReady, "zeta")
	mk("t1", store.SnapshotCreating, "") // not uploaded yet
	mk("t2", store.SnapshotReady, "alpha")
	mk("t2", store.SnapshotDeleting, "Zulu") // live until the record is deleted
	shared := mk("t2", store.SnapshotReady, "zeta")
	creating := mk("t1", store.SnapshotCreating, "")

	check := func(step string, want []string) {
		t.Helper()
		got, err := s.AllSnapshotManifests(ctx)
		if err != nil {
			t.Fatalf("AllSnapshotManifests() %s = %v", step, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("AllSnapshotManifests() %s (-want +got):\n%s", step, diff)
		}
	}
	// Bytewise order: upper case first.
	check("after create", []string{"Zulu", "alpha", "zeta"})
	unsettled, err := s.UnsettledSnapshots(ctx)
	if err != nil {
		t.Fatalf("UnsettledSnapshots() = %v", err)
	}
	var states []store.SnapshotState
	for _, sn := range unsettled {
		states = append(states, sn.State)
	}
	if diff := cmp.Diff([]store.SnapshotState{store.SnapshotCreating, store.SnapshotDeleting, store.SnapshotCreating}, states); diff != "" {
		t.Errorf("UnsettledSnapshots() states, oldest first (-want +got):\n%s", diff)
	}
	if len(unsettled) == 3 && unsettled[2].ID != creating.ID {
		t.Errorf("UnsettledSnapshots()[2] = %s, want %s", unsettled[2].ID, creating.ID)
	}

	creating.Manifest = "mid"
	if _, err := s.UpdateSnapshot(ctx, creating); err != nil {
		t.Fatalf("UpdateSnapshot(%s) = %v", creating.ID, err)
	}
	check("after update", []string{"Zulu", "alpha", "mid", "zeta"})
	if err := s.DeleteSnapshot(ctx, "t2", shared.ID); err != nil {
		t.Fatalf("DeleteSnapshot(%s) = %v", shared.ID, err)
	}
	check("after deleting one of two users of zeta", []string{"Zulu", "alpha", "mid", "zeta"})
}

func testSnapshotBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	in := newSnapshot("t1", store.NewSandboxID())
	in.Name = "keep"
	in.Manifest = "m1"
	in.NewBytes = 42
	in.Meta = json.RawMessage(`{"vmm":"qemu"}`)
	existing := mustSnapshot(t, s, in)
	good := newSnapshot("t1", store.NewSandboxID())

	snapshot := func(f func(*store.Snapshot)) store.Snapshot {
		sn := good
		f(&sn)
		return sn
	}
	update := func(f func(*store.Snapshot)) func() error {
		return func() error {
			sn := existing
			f(&sn)
			_, err := s.UpdateSnapshot(ctx, sn)
			return err
		}
	}
	bad := []struct {
		name string
		f    func(*store.Snapshot)
	}{
		{"empty id", func(sn *store.Snapshot) { sn.ID = "" }},
		{"sandbox id", func(sn *store.Snapshot) { sn.ID = store.NewSandboxID() }},
		{"malformed id", func(sn *store.Snapshot) { sn.ID = "snp_TOOSHORT" }},
		{"empty team", func(sn *store.Snapshot) { sn.TeamID = "" }},
		{"empty sandbox id", func(sn *store.Snapshot) { sn.SandboxID = "" }},
		{"malformed sandbox id", func(sn *store.Snapshot) { sn.SandboxID = "sbx_x" }},
		{"name with slash", func(sn *store.Snapshot) { sn.Name = "a/b" }},
		{"name with space", func(sn *store.Snapshot) { sn.Name = "a b" }},
		{"name too long", func(sn *store.Snapshot) { sn.Name = strings.Repeat("n", 129) }},
		{"unknown state", func(sn *store.Snapshot) { sn.State = "exploded" }},
		{"empty state", func(sn *store.Snapshot) { sn.State = "" }},
		{"sandbox state", func(sn *store.Snapshot) { sn.State = store.SnapshotState(store.StateRunning) }},
		{"bad worker id", func(sn *store.Snapshot) { sn.WorkerID = "w 1" }},
		{"manifest with slash", func(sn *store.Snapshot) { sn.Manifest = "../m" }},
		{"negative logical bytes", func(sn *store.Snapshot) { sn.LogicalBytes = -1 }},
		{"negative new bytes", func(sn *store.Snapshot) { sn.NewBytes = -1 }},
		{"truncated meta", func(sn *store.Snapshot) { sn.Meta = json.RawMessage(`{"vmm":`) }},
		{"empty meta", func(sn *store.Snapshot) { sn.Meta = json.RawMessage{} }},
	}
	type op struct {
		name string
		fn   func() error
	}
	tests := []op{
		{"list malformed sandbox id", func() error { _, err := s.ListSnapshots(ctx, "t1", "sbx_x"); return err }},
		{"by empty name", func() error { _, err := s.SnapshotByName(ctx, "t1", ""); return err }},
	}
	for _, b := range bad {
		tests = append(tests,
			op{"create " + b.name, func() error { _, err := s.CreateSnapshot(ctx, snapshot(b.f)); return err }},
			op{"update " + b.name, update(b.f)})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantKind(t, tt.name, tt.fn(), store.ErrInvalid, errkind.InvalidArgument)
		})
	}

	// Nothing was written.
	list, err := s.ListSnapshots(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListSnapshots() = %v", err)
	}
	if diff := cmp.Diff([]store.Snapshot{existing}, list); diff != "" {
		t.Errorf("ListSnapshots() after bad input (-want +got):\n%s", diff)
	}
	if n, err := s.TeamSnapshotBytes(ctx, "t1"); err != nil || n != 42 {
		t.Errorf("TeamSnapshotBytes(t1) after bad input = %d, %v; want 42", n, err)
	}
	if ms, err := s.AllSnapshotManifests(ctx); err != nil || !cmp.Equal(ms, []string{"m1"}) {
		t.Errorf("AllSnapshotManifests() after bad input = %q, %v; want [m1]", ms, err)
	}
}
