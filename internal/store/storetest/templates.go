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

func newTemplate(team, name string) store.Template {
	return store.Template{TeamID: team, Name: name, State: store.TemplateBuilding}
}

func mustTemplate(t *testing.T, s store.Store, tm store.Template) store.Template {
	t.Helper()
	got, err := s.CreateTemplate(t.Context(), tm)
	if err != nil {
		t.Fatalf("setup: CreateTemplate(%s, %s): %v", tm.TeamID, tm.Name, err)
	}
	return got
}

// mustSetTemplateState moves tm to state and returns the updated record.
func mustSetTemplateState(t *testing.T, s store.Store, tm store.Template, state store.TemplateState) store.Template {
	t.Helper()
	tm.State = state
	got, err := s.UpdateTemplate(t.Context(), tm)
	if err != nil {
		t.Fatalf("setup: UpdateTemplate(%s:%d to %s): %v", tm.Name, tm.Version, state, err)
	}
	return got
}

// templateRefs names each template as "name:version".
func templateRefs(ts []store.Template) []string {
	var refs []string
	for _, tm := range ts {
		refs = append(refs, fmt.Sprintf("%s:%d", tm.Name, tm.Version))
	}
	return refs
}

func testTemplateCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")

	in := newTemplate("t1", "python")
	in.Key = "0123456789abcdef"
	in.Meta = json.RawMessage(`{"start": "python3 -m http.server", "env": {"A": "1"}}`) // kept byte for byte
	// Ignored: the store numbers versions.
	in.Version = 7
	created, err := s.CreateTemplate(ctx, in)
	if err != nil {
		t.Fatalf("CreateTemplate() = %v", err)
	}
	want := in
	want.Version, want.Rev = 1, 1
	want.Created, want.Updated = created.Created, created.Created
	if diff := cmp.Diff(want, created); diff != "" {
		t.Errorf("CreateTemplate() (-want +got):\n%s", diff)
	}
	if created.Created.IsZero() || !created.Updated.Equal(created.Created) {
		t.Errorf("CreateTemplate() = created %v, updated %v; want created == updated != zero", created.Created, created.Updated)
	}
	got, err := s.Template(ctx, "t1", "python", 1)
	if err != nil {
		t.Fatalf("Template(python, 1) = %v", err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("Template(python, 1) after create (-want +got):\n%s", diff)
	}
	_, err = s.Template(ctx, "t1", "python", 0)
	wantKind(t, "Template(python, 0) while building", err, store.ErrNotFound, errkind.NotFound)

	// Without meta: Meta comes back nil.
	bare := mustTemplate(t, s, newTemplate("t1", "bare"))
	got, err = s.Template(ctx, "t1", "bare", 1)
	if err != nil {
		t.Fatalf("Template(bare, 1) = %v", err)
	}
	if diff := cmp.Diff(bare, got); diff != "" || got.Meta != nil {
		t.Errorf("Template(bare, 1) = meta %q (-want +got):\n%s", got.Meta, diff)
	}

	_, err = s.CreateTemplate(ctx, newTemplate("nope", "python"))
	wantKind(t, "CreateTemplate(unknown team)", err, store.ErrNotFound, errkind.NotFound)

	upd := created
	upd.State = store.TemplateReady
	upd.Key = ""
	upd.SnapshotID = store.NewSnapshotID()
	upd.Meta = json.RawMessage(`{"report": "ok"}`)
	updated, err := s.UpdateTemplate(ctx, upd)
	if err != nil {
		t.Fatalf("UpdateTemplate() = %v", err)
	}
	want = upd
	want.Rev = 2
	want.Updated = updated.Updated
	if diff := cmp.Diff(want, updated); diff != "" {
		t.Errorf("UpdateTemplate() (-want +got):\n%s", diff)
	}
	if updated.Updated.Before(created.Updated) {
		t.Errorf("UpdateTemplate().Updated = %v, before Created %v", updated.Updated, created.Updated)
	}
	for _, version := range []int{1, 0} {
		got, err = s.Template(ctx, "t1", "python", version)
		if err != nil {
			t.Fatalf("Template(python, %d) = %v", version, err)
		}
		if diff := cmp.Diff(updated, got); diff != "" {
			t.Errorf("Template(python, %d) after update (-want +got):\n%s", version, diff)
		}
	}

	// Meta of exactly 1 MiB is kept; clearing it stores nil.
	big := updated
	big.Meta = json.RawMessage(`"` + strings.Repeat("m", 1<<20-2) + `"`)
	if big, err = s.UpdateTemplate(ctx, big); err != nil {
		t.Fatalf("UpdateTemplate(1 MiB meta) = %v", err)
	}
	if got, err := s.Template(ctx, "t1", "python", 1); err != nil || len(got.Meta) != 1<<20 {
		t.Errorf("Template(python, 1) after 1 MiB meta = %d bytes, %v; want %d", len(got.Meta), err, 1<<20)
	}
	big.Meta = nil
	if updated, err = s.UpdateTemplate(ctx, big); err != nil || updated.Meta != nil || updated.Rev != 4 {
		t.Errorf("UpdateTemplate(nil meta) = meta %q rev %d, %v; want nil meta rev 4", updated.Meta, updated.Rev, err)
	}

	list, err := s.ListTemplates(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListTemplates(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.Template{bare, updated}, list); diff != "" {
		t.Errorf("ListTemplates(t1) (-want +got):\n%s", diff)
	}

	if err := s.DeleteTemplate(ctx, "t1", "python", 1); err != nil {
		t.Fatalf("DeleteTemplate(python, 1) = %v", err)
	}
	for _, version := range []int{1, 0} {
		_, err = s.Template(ctx, "t1", "python", version)
		wantKind(t, fmt.Sprintf("Template(python, %d) after delete", version), err, store.ErrNotFound, errkind.NotFound)
	}
	err = s.DeleteTemplate(ctx, "t1", "python", 1)
	wantKind(t, "DeleteTemplate(python, 1) again", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.UpdateTemplate(ctx, updated)
	wantKind(t, "UpdateTemplate(deleted)", err, store.ErrNotFound, errkind.NotFound)
	if list, err := s.ListTemplates(ctx, "t1", "python"); err != nil || len(list) != 0 {
		t.Errorf("ListTemplates(t1, python) after delete = %v, %v; want none", templateRefs(list), err)
	}
}

func testTemplateVersions(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	next := func(team, name string, want int) {
		t.Helper()
		got, err := s.CreateTemplate(ctx, newTemplate(team, name))
		if err != nil || got.Version != want {
			t.Errorf("CreateTemplate(%s, %s) = version %d, %v; want version %d", team, name, got.Version, err, want)
		}
	}
	next("t1", "base", 1)
	next("t1", "base", 2)
	next("t1", "base", 3)
	next("t1", "other", 1) // numbered per name
	next("t2", "base", 1)  // and per team

	// Deleting the highest version does not free its number.
	if err := s.DeleteTemplate(ctx, "t1", "base", 3); err != nil {
		t.Fatalf("DeleteTemplate(base, 3) = %v", err)
	}
	next("t1", "base", 4)
	// Nor does deleting every version.
	for _, v := range []int{1, 2, 4} {
		if err := s.DeleteTemplate(ctx, "t1", "base", v); err != nil {
			t.Fatalf("DeleteTemplate(base, %d) = %v", v, err)
		}
	}
	next("t1", "base", 5)

	list, err := s.ListTemplates(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListTemplates(t1) = %v", err)
	}
	if diff := cmp.Diff([]string{"base:5", "other:1"}, templateRefs(list)); diff != "" {
		t.Errorf("ListTemplates(t1) (-want +got):\n%s", diff)
	}

	// Concurrent creates of one name get distinct, consecutive versions.
	const n = 8
	versions := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			tm, err := s.CreateTemplate(t.Context(), newTemplate("t2", "race"))
			versions[i], errs[i] = tm.Version, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent CreateTemplate(t2, race): %v", err)
	}
	seen := make(map[int]bool)
	for _, v := range versions {
		if v < 1 || v > n || seen[v] {
			t.Errorf("concurrent CreateTemplate(t2, race) versions = %v, want 1 to %d once each", versions, n)
			break
		}
		seen[v] = true
	}
	list, err = s.ListTemplates(ctx, "t2", "race")
	if err != nil || len(list) != n {
		t.Errorf("ListTemplates(t2, race) = %v, %v; want %d versions", templateRefs(list), err, n)
	}
}

func testTemplateLatestReady(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	latest := func(step string, want int) {
		t.Helper()
		got, err := s.Template(ctx, "t1", "base", 0)
		if want == 0 {
			wantKind(t, "Template(base, 0) "+step, err, store.ErrNotFound, errkind.NotFound)
			return
		}
		if err != nil || got.Version != want || got.State != store.TemplateReady {
			t.Errorf("Template(base, 0) %s = version %d state %s, %v; want version %d ready", step, got.Version, got.State, err, want)
		}
	}
	var vs []store.Template
	for range 5 {
		vs = append(vs, mustTemplate(t, s, newTemplate("t1", "base")))
	}
	latest("with every version building", 0)
	vs[0] = mustSetTemplateState(t, s, vs[0], store.TemplateReady)
	vs[1] = mustSetTemplateState(t, s, vs[1], store.TemplateReady)
	vs[2] = mustSetTemplateState(t, s, vs[2], store.TemplateFailed)
	// vs[3] stays building.
	vs[4] = mustSetTemplateState(t, s, vs[4], store.TemplateDeleting)
	latest("skipping failed, building and deleting", 2)
	vs[3] = mustSetTemplateState(t, s, vs[3], store.TemplateReady)
	latest("after v4 is ready", 4)
	vs[3] = mustSetTemplateState(t, s, vs[3], store.TemplateDeleting)
	latest("after v4 is deleting", 2)
	if err := s.DeleteTemplate(ctx, "t1", "base", 2); err != nil {
		t.Fatalf("DeleteTemplate(base, 2) = %v", err)
	}
	latest("after deleting v2", 1)

	// Another name's and another team's ready versions do not count.
	mustSetTemplateState(t, s, mustTemplate(t, s, newTemplate("t1", "other")), store.TemplateReady)
	mustTeam(t, s, "t2")
	mustSetTemplateState(t, s, mustTemplate(t, s, newTemplate("t2", "base")), store.TemplateReady)
	latest("with other ready templates", 1)
	_, err := s.Template(ctx, "t1", "nope", 0)
	wantKind(t, "Template(nope, 0)", err, store.ErrNotFound, errkind.NotFound)
}

func testTemplateVersionConflict(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	tm := mustTemplate(t, s, newTemplate("t1", "base"))

	first, second := tm, tm
	first.State = store.TemplateReady
	first.SnapshotID = store.NewSnapshotID()
	second.State = store.TemplateFailed
	if _, err := s.UpdateTemplate(ctx, first); err != nil {
		t.Fatalf("UpdateTemplate(first) = %v", err)
	}
	_, err := s.UpdateTemplate(ctx, second)
	wantKind(t, "UpdateTemplate(stale rev)", err, store.ErrVersionConflict, errkind.Conflict)
	got, err := s.Template(ctx, "t1", "base", 1)
	if err != nil {
		t.Fatalf("Template(base, 1) = %v", err)
	}
	if got.State != store.TemplateReady || got.SnapshotID != first.SnapshotID || got.Rev != 2 {
		t.Errorf("Template(base, 1) = state %s snapshot %s rev %d, want ready %s rev 2", got.State, got.SnapshotID, got.Rev, first.SnapshotID)
	}

	// Concurrent updates at one rev: exactly one wins.
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			u := got
			u.Meta = json.RawMessage(fmt.Sprint(i))
			_, errs[i] = s.UpdateTemplate(t.Context(), u)
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("UpdateTemplate by writers %d and %d both succeeded at rev 2", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrVersionConflict):
			t.Errorf("UpdateTemplate by writer %d = %v, want nil or %v", i, err, store.ErrVersionConflict)
		}
	}
	if winner < 0 {
		t.Fatalf("no UpdateTemplate succeeded")
	}
	got, err = s.Template(ctx, "t1", "base", 1)
	if err != nil {
		t.Fatalf("Template(base, 1) = %v", err)
	}
	if want := fmt.Sprint(winner); got.Rev != 3 || string(got.Meta) != want {
		t.Errorf("Template(base, 1) = rev %d meta %s, want rev 3 meta %s", got.Rev, got.Meta, want)
	}
}

func testTemplateTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "a")
	mustTeam(t, s, "b")
	in := newTemplate("a", "base")
	in.SnapshotID = store.NewSnapshotID()
	tm := mustSetTemplateState(t, s, mustTemplate(t, s, in), store.TemplateReady)
	e, err := s.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: "a", Key: "abc", SnapshotID: store.NewSnapshotID()})
	if err != nil {
		t.Fatalf("PutBuildCache(a, abc) = %v", err)
	}

	for _, version := range []int{1, 0} {
		_, err := s.Template(ctx, "b", "base", version)
		wantKind(t, fmt.Sprintf("Template(other team, %d)", version), err, store.ErrNotFound, errkind.NotFound)
	}
	err = s.DeleteTemplate(ctx, "b", "base", 1)
	wantKind(t, "DeleteTemplate(other team)", err, store.ErrNotFound, errkind.NotFound)
	steal := tm
	steal.TeamID = "b"
	steal.State = store.TemplateDeleting
	_, err = s.UpdateTemplate(ctx, steal)
	wantKind(t, "UpdateTemplate(other team)", err, store.ErrNotFound, errkind.NotFound)
	for _, name := range []string{"", "base"} {
		if list, err := s.ListTemplates(ctx, "b", name); err != nil || len(list) != 0 {
			t.Errorf("ListTemplates(b, %q) = %v, %v; want none", name, templateRefs(list), err)
		}
	}
	_, err = s.BuildCache(ctx, "b", "abc")
	wantKind(t, "BuildCache(other team)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteBuildCache(ctx, "b", "abc")
	wantKind(t, "DeleteBuildCache(other team)", err, store.ErrNotFound, errkind.NotFound)
	if list, err := s.ListBuildCache(ctx, "b"); err != nil || len(list) != 0 {
		t.Errorf("ListBuildCache(b) = %v, %v; want none", list, err)
	}
	for _, id := range []string{tm.SnapshotID, e.SnapshotID} {
		if used, err := s.SnapshotInUse(ctx, "b", id); err != nil || used {
			t.Errorf("SnapshotInUse(b, %s) = %t, %v; want false", id, used, err)
		}
	}
	// Team b's own version of the name is numbered from 1.
	if own := mustTemplate(t, s, newTemplate("b", "base")); own.Version != 1 {
		t.Errorf("CreateTemplate(b, base) = version %d, want 1", own.Version)
	}

	got, err := s.Template(ctx, "a", "base", 1)
	if err != nil {
		t.Fatalf("Template(a, base, 1) = %v", err)
	}
	if diff := cmp.Diff(tm, got); diff != "" {
		t.Errorf("Template(a, base, 1) after other team's attempts (-want +got):\n%s", diff)
	}
	gotE, err := s.BuildCache(ctx, "a", "abc")
	if err != nil {
		t.Fatalf("BuildCache(a, abc) = %v", err)
	}
	if diff := cmp.Diff(e, gotE); diff != "" {
		t.Errorf("BuildCache(a, abc) after other team's attempts (-want +got):\n%s", diff)
	}
}

func testTemplateList(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	long := strings.Repeat("n", 64)
	for _, name := range []string{"base", "alpha", "Zeta", "base", long, "alpha", "base", "a.b", "a-b"} {
		mustTemplate(t, s, newTemplate("t1", name))
	}
	tests := []struct {
		name string
		want []string
	}{
		// Bytewise by name: '-' < '.' < upper case < lower case.
		{"", []string{"Zeta:1", "a-b:1", "a.b:1", "alpha:1", "alpha:2", "base:1", "base:2", "base:3", long + ":1"}},
		{"base", []string{"base:1", "base:2", "base:3"}},
		{"zeta", nil},
	}
	for _, tt := range tests {
		list, err := s.ListTemplates(ctx, "t1", tt.name)
		if err != nil {
			t.Fatalf("ListTemplates(t1, %q) = %v", tt.name, err)
		}
		if diff := cmp.Diff(tt.want, templateRefs(list)); diff != "" {
			t.Errorf("ListTemplates(t1, %q) (-want +got):\n%s", tt.name, diff)
		}
	}
}

func testBuildCache(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	put := func(team, key string) store.BuildCacheEntry {
		t.Helper()
		in := store.BuildCacheEntry{TeamID: team, Key: key, SnapshotID: store.NewSnapshotID()}
		e, err := s.PutBuildCache(ctx, in)
		if err != nil {
			t.Fatalf("PutBuildCache(%s, %s) = %v", team, key, err)
		}
		want := in
		want.Created = e.Created
		if diff := cmp.Diff(want, e); diff != "" || e.Created.IsZero() {
			t.Errorf("PutBuildCache(%s, %s) = created %v (-want +got):\n%s", team, key, e.Created, diff)
		}
		return e
	}
	long := strings.Repeat("f", 128)
	a := put("t1", "0a")
	b := put("t1", "0b")
	c := put("t1", long)
	other := put("t2", "0a") // keys are per team

	got, err := s.BuildCache(ctx, "t1", "0a")
	if err != nil {
		t.Fatalf("BuildCache(t1, 0a) = %v", err)
	}
	if diff := cmp.Diff(a, got); diff != "" {
		t.Errorf("BuildCache(t1, 0a) (-want +got):\n%s", diff)
	}
	_, err = s.BuildCache(ctx, "t1", "0c")
	wantKind(t, "BuildCache(t1, 0c)", err, store.ErrNotFound, errkind.NotFound)

	dup := store.BuildCacheEntry{TeamID: "t1", Key: "0a", SnapshotID: store.NewSnapshotID()}
	_, err = s.PutBuildCache(ctx, dup)
	wantKind(t, "PutBuildCache(taken key)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: "nope", Key: "0a", SnapshotID: dup.SnapshotID})
	wantKind(t, "PutBuildCache(unknown team)", err, store.ErrNotFound, errkind.NotFound)

	list, err := s.ListBuildCache(ctx, "t1")
	if err != nil {
		t.Fatalf("ListBuildCache(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.BuildCacheEntry{a, b, c}, list); diff != "" {
		t.Errorf("ListBuildCache(t1), oldest first (-want +got):\n%s", diff)
	}

	if err := s.DeleteBuildCache(ctx, "t1", "0a"); err != nil {
		t.Fatalf("DeleteBuildCache(t1, 0a) = %v", err)
	}
	_, err = s.BuildCache(ctx, "t1", "0a")
	wantKind(t, "BuildCache(t1, 0a) after delete", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteBuildCache(ctx, "t1", "0a")
	wantKind(t, "DeleteBuildCache(t1, 0a) again", err, store.ErrNotFound, errkind.NotFound)
	list, err = s.ListBuildCache(ctx, "t1")
	if err != nil {
		t.Fatalf("ListBuildCache(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.BuildCacheEntry{b, c}, list); diff != "" {
		t.Errorf("ListBuildCache(t1) after delete (-want +got):\n%s", diff)
	}
	got, err = s.BuildCache(ctx, "t2", "0a")
	if err != nil {
		t.Fatalf("BuildCache(t2, 0a) = %v", err)
	}
	if diff := cmp.Diff(other, got); diff != "" {
		t.Errorf("BuildCache(t2, 0a) after t1's delete (-want +got):\n%s", diff)
	}
	// A deleted key may be put again.
	put("t1", "0a")
}

func testSnapshotInUse(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	snapA, snapB, snapC := store.NewSnapshotID(), store.NewSnapshotID(), store.NewSnapshotID()
	check := func(step, id string, want bool) {
		t.Helper()
		if got, err := s.SnapshotInUse(ctx, "t1", id); err != nil || got != want {
			t.Errorf("SnapshotInUse(t1, %s) %s = %t, %v; want %t", id, step, got, err, want)
		}
	}
	check("with no templates", snapA, false)

	in := newTemplate("t1", "base")
	in.SnapshotID = snapA // a template in any state holds its snapshot
	tm := mustTemplate(t, s, in)
	if _, err := s.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: "t1", Key: "01", SnapshotID: snapB}); err != nil {
		t.Fatalf("PutBuildCache() = %v", err)
	}
	mustTemplate(t, s, newTemplate("t1", "base")) // no snapshot yet
	check("by a building template", snapA, true)
	check("by a cache entry", snapB, true)
	check("by nothing", snapC, false)
	for _, state := range []store.TemplateState{store.TemplateReady, store.TemplateFailed, store.TemplateDeleting} {
		tm = mustSetTemplateState(t, s, tm, state)
		check("by a "+string(state)+" template", snapA, true)
	}

	tm.SnapshotID = snapC
	tm = mustSetTemplateState(t, s, tm, store.TemplateReady)
	check("after the template moved on", snapA, false)
	check("after the template moved to it", snapC, true)
	if err := s.DeleteTemplate(ctx, "t1", "base", tm.Version); err != nil {
		t.Fatalf("DeleteTemplate() = %v", err)
	}
	check("after the template was deleted", snapC, false)
	if err := s.DeleteBuildCache(ctx, "t1", "01"); err != nil {
		t.Fatalf("DeleteBuildCache() = %v", err)
	}
	check("after the cache entry was deleted", snapB, false)
	_, err := s.SnapshotInUse(ctx, "t1", "")
	wantKind(t, "SnapshotInUse(empty id)", err, store.ErrInvalid, errkind.InvalidArgument)
}

func testUnsettledTemplates(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	if got, err := s.UnsettledTemplates(ctx); err != nil || len(got) != 0 {
		t.Errorf("UnsettledTemplates() of an empty store = %v, %v; want none", templateRefs(got), err)
	}
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	mk := func(team, name string, state store.TemplateState) store.Template {
		tm := mustTemplate(t, s, newTemplate(team, name))
		if state != store.TemplateBuilding {
			tm = mustSetTemplateState(t, s, tm, state)
		}
		return tm
	}
	// Teams and names ascend with creation, so ties in Created keep this
	// order too.
	a := mk("t1", "a", store.TemplateBuilding)
	mk("t1", "b", store.TemplateReady)
	c := mk("t2", "c", store.TemplateDeleting)
	mk("t2", "d", store.TemplateFailed)
	e := mk("t2", "e", store.TemplateBuilding)

	got, err := s.UnsettledTemplates(ctx)
	if err != nil {
		t.Fatalf("UnsettledTemplates() = %v", err)
	}
	if diff := cmp.Diff([]store.Template{a, c, e}, got); diff != "" {
		t.Errorf("UnsettledTemplates(), oldest first (-want +got):\n%s", diff)
	}

	mustSetTemplateState(t, s, a, store.TemplateReady)
	if err := s.DeleteTemplate(ctx, "t2", "c", 1); err != nil {
		t.Fatalf("DeleteTemplate(c) = %v", err)
	}
	got, err = s.UnsettledTemplates(ctx)
	if err != nil {
		t.Fatalf("UnsettledTemplates() = %v", err)
	}
	if diff := cmp.Diff([]string{"e:1"}, templateRefs(got)); diff != "" {
		t.Errorf("UnsettledTemplates() after settling a and c (-want +got):\n%s", diff)
	}
}

func testTemplatePersistence(t *testing.T, h Harness) {
	ctx := t.Context()
	loc := h.New(t)
	s, err := h.Open(ctx, loc)
	if err != nil {
		t.Fatalf("setup: open: %v", err)
	}
	mustTeam(t, s, "t1")
	in := newTemplate("t1", "base")
	in.Key = "beef"
	in.SnapshotID = store.NewSnapshotID()
	in.Meta = json.RawMessage(`{"start": "sh"}`)
	v1 := mustSetTemplateState(t, s, mustTemplate(t, s, in), store.TemplateReady)
	v2 := mustTemplate(t, s, newTemplate("t1", "base"))
	e, err := s.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: "t1", Key: "beef", SnapshotID: in.SnapshotID})
	if err != nil {
		t.Fatalf("PutBuildCache() = %v", err)
	}
	if err := s.DeleteTemplate(ctx, "t1", "base", v2.Version); err != nil {
		t.Fatalf("DeleteTemplate(base, 2) = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}

	s = open(t, h, loc)
	got, err := s.Template(ctx, "t1", "base", 0)
	if err != nil {
		t.Fatalf("Template(base, 0) after reopen = %v", err)
	}
	if diff := cmp.Diff(v1, got); diff != "" {
		t.Errorf("Template(base, 0) after reopen (-want +got):\n%s", diff)
	}
	gotE, err := s.BuildCache(ctx, "t1", "beef")
	if err != nil {
		t.Fatalf("BuildCache(beef) after reopen = %v", err)
	}
	if diff := cmp.Diff(e, gotE); diff != "" {
		t.Errorf("BuildCache(beef) after reopen (-want +got):\n%s", diff)
	}
	// The deleted version's number stays taken.
	if v3 := mustTemplate(t, s, newTemplate("t1", "base")); v3.Version != 3 {
		t.Errorf("CreateTemplate(base) after reopen = version %d, want 3", v3.Version)
	}
}

func testTemplateBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	in := newTemplate("t1", "keep")
	in.Key = "abc"
	in.Meta = json.RawMessage(`{"start":"sh"}`)
	existing := mustTemplate(t, s, in)
	entry, err := s.PutBuildCache(ctx, store.BuildCacheEntry{TeamID: "t1", Key: "abc", SnapshotID: store.NewSnapshotID()})
	if err != nil {
		t.Fatalf("setup: PutBuildCache: %v", err)
	}
	good := newTemplate("t1", "new")

	bad := []struct {
		name string
		f    func(*store.Template)
	}{
		{"empty team", func(tm *store.Template) { tm.TeamID = "" }},
		{"empty name", func(tm *store.Template) { tm.Name = "" }},
		{"name with colon", func(tm *store.Template) { tm.Name = "base:1" }},
		{"name with slash", func(tm *store.Template) { tm.Name = "a/b" }},
		{"name too long", func(tm *store.Template) { tm.Name = strings.Repeat("n", 65) }},
		{"unknown state", func(tm *store.Template) { tm.State = "exploded" }},
		{"empty state", func(tm *store.Template) { tm.State = "" }},
		{"snapshot state", func(tm *store.Template) { tm.State = store.TemplateState(store.SnapshotCreating) }},
		{"upper case key", func(tm *store.Template) { tm.Key = "ABC" }},
		{"non-hex key", func(tm *store.Template) { tm.Key = "xyz" }},
		{"key too long", func(tm *store.Template) { tm.Key = strings.Repeat("a", 129) }},
		{"sandbox id as snapshot id", func(tm *store.Template) { tm.SnapshotID = store.NewSandboxID() }},
		{"malformed snapshot id", func(tm *store.Template) { tm.SnapshotID = "snp_x" }},
		{"truncated meta", func(tm *store.Template) { tm.Meta = json.RawMessage(`{"start":`) }},
		{"empty meta", func(tm *store.Template) { tm.Meta = json.RawMessage{} }},
		{"meta over 1 MiB", func(tm *store.Template) { tm.Meta = json.RawMessage(`"` + strings.Repeat("m", 1<<20-1) + `"`) }},
	}
	type op struct {
		name string
		fn   func() error
	}
	var tests []op
	for _, b := range bad {
		tests = append(tests,
			op{"create " + b.name, func() error {
				tm := good
				b.f(&tm)
				_, err := s.CreateTemplate(ctx, tm)
				return err
			}},
			op{"update " + b.name, func() error {
				tm := existing
				b.f(&tm)
				_, err := s.UpdateTemplate(ctx, tm)
				return err
			}})
	}
	cacheEntry := func(f func(*store.BuildCacheEntry)) func() error {
		return func() error {
			e := store.BuildCacheEntry{TeamID: "t1", Key: "def", SnapshotID: store.NewSnapshotID()}
			f(&e)
			_, err := s.PutBuildCache(ctx, e)
			return err
		}
	}
	tests = append(tests, []op{
		{"update version 0", func() error {
			tm := existing
			tm.Version = 0
			_, err := s.UpdateTemplate(ctx, tm)
			return err
		}},
		{"get negative version", func() error { _, err := s.Template(ctx, "t1", "keep", -1); return err }},
		{"get empty name", func() error { _, err := s.Template(ctx, "t1", "", 1); return err }},
		{"get name with colon", func() error { _, err := s.Template(ctx, "t1", "keep:1", 0); return err }},
		{"list name with colon", func() error { _, err := s.ListTemplates(ctx, "t1", "keep:1"); return err }},
		{"delete version 0", func() error { return s.DeleteTemplate(ctx, "t1", "keep", 0) }},
		{"delete negative version", func() error { return s.DeleteTemplate(ctx, "t1", "keep", -1) }},
		{"delete empty name", func() error { return s.DeleteTemplate(ctx, "t1", "", 1) }},
		{"put cache empty team", cacheEntry(func(e *store.BuildCacheEntry) { e.TeamID = "" })},
		{"put cache empty key", cacheEntry(func(e *store.BuildCacheEntry) { e.Key = "" })},
		{"put cache upper case key", cacheEntry(func(e *store.BuildCacheEntry) { e.Key = "DEF" })},
		{"put cache key too long", cacheEntry(func(e *store.BuildCacheEntry) { e.Key = strings.Repeat("d", 129) })},
		{"put cache empty snapshot id", cacheEntry(func(e *store.BuildCacheEntry) { e.SnapshotID = "" })},
		{"put cache sandbox id", cacheEntry(func(e *store.BuildCacheEntry) { e.SnapshotID = store.NewSandboxID() })},
		{"get cache empty key", func() error { _, err := s.BuildCache(ctx, "t1", ""); return err }},
		{"delete cache bad key", func() error { return s.DeleteBuildCache(ctx, "t1", "ABC") }},
		{"in use malformed snapshot id", func() error { _, err := s.SnapshotInUse(ctx, "t1", "snp_x"); return err }},
	}...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantKind(t, tt.name, tt.fn(), store.ErrInvalid, errkind.InvalidArgument)
		})
	}

	// Nothing was written, and no version number was used up.
	list, err := s.ListTemplates(ctx, "t1", "")
	if err != nil {
		t.Fatalf("ListTemplates() = %v", err)
	}
	if diff := cmp.Diff([]store.Template{existing}, list); diff != "" {
		t.Errorf("ListTemplates() after bad input (-want +got):\n%s", diff)
	}
	es, err := s.ListBuildCache(ctx, "t1")
	if err != nil {
		t.Fatalf("ListBuildCache() = %v", err)
	}
	if diff := cmp.Diff([]store.BuildCacheEntry{entry}, es); diff != "" {
		t.Errorf("ListBuildCache() after bad input (-want +got):\n%s", diff)
	}
	if tm := mustTemplate(t, s, good); tm.Version != 1 {
		t.Errorf("CreateTemplate(new) after bad input = version %d, want 1", tm.Version)
	}
}
