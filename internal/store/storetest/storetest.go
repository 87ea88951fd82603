// Package storetest is the conformance suite every [store.Store]
// implementation runs.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/store"
)

// Harness tells the suite how to make stores of one backend.
type Harness struct {
	// New returns the location (file path, DSN) of a new, empty store
	// that lives until t ends.
	New func(t *testing.T) string
	// Open opens the store at loc. The suite closes what it opens.
	Open func(ctx context.Context, loc string) (store.Store, error)
	// Exec runs the SQL statements query on the store at loc behind the
	// back of the stores open on it, as someone with the database's
	// credentials could: the audit tests tamper with the log through it.
	Exec func(ctx context.Context, loc, query string) error
}

// Run runs the conformance suite against the backend h describes.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"Teams", testTeams},
		{"TeamQuota", testTeamQuota},
		{"APIKeys", testAPIKeys},
		{"SandboxCRUD", testSandboxCRUD},
		{"TeamIsolation", testTeamIsolation},
		{"VersionConflict", testVersionConflict},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"ConcurrentCreates", testConcurrentCreates},
		{"LabelsFilter", testLabelsFilter},
		{"ByWorkerAndExpired", testByWorkerAndExpired},
		{"SnapshotCRUD", testSnapshotCRUD},
		{"SnapshotNames", testSnapshotNames},
		{"SnapshotTeamIsolation", testSnapshotTeamIsolation},
		{"SnapshotVersionConflict", testSnapshotVersionConflict},
		{"SnapshotConcurrentUpdates", testSnapshotConcurrentUpdates},
		{"SnapshotListBySandbox", testSnapshotListBySandbox},
		{"SnapshotBytes", testSnapshotBytes},
		{"SnapshotManifests", testSnapshotManifests},
		{"SnapshotBadInput", testSnapshotBadInput},
		{"TemplateCRUD", testTemplateCRUD},
		{"TemplateVersions", testTemplateVersions},
		{"TemplateLatestReady", testTemplateLatestReady},
		{"TemplateVersionConflict", testTemplateVersionConflict},
		{"TemplateTeamIsolation", testTemplateTeamIsolation},
		{"TemplateList", testTemplateList},
		{"TemplatePersistence", testTemplatePersistence},
		{"TemplateBadInput", testTemplateBadInput},
		{"BuildCache", testBuildCache},
		{"SnapshotInUse", testSnapshotInUse},
		{"UnsettledTemplates", testUnsettledTemplates},
		{"SecretCRUD", testSecretCRUD},
		{"SecretTeamIsolation", testSecretTeamIsolation},
		{"SecretList", testSecretList},
		{"SecretPersistence", testSecretPersistence},
		{"SecretBadInput", testSecretBadInput},
		{"EgressLogCRUD", testEgressLogCRUD},
		{"EgressLogTeamIsolation", testEgressLogTeamIsolation},
		{"EgressLogDeleteBefore", testEgressLogDeleteBefore},
		{"EgressLogPersistence", testEgressLogPersistence},
		{"EgressLogBadInput", testEgressLogBadInput},
		{"EventsWithStateChanges", testEventsWithStateChanges},
		{"EventsFenced", testEventsFenced},
		{"EventsQuery", testEventsQuery},
		{"EventsRetention", testEventsRetention},
		{"EventsFollow", testEventsFollow},
		{"WebhookCRUD", testWebhookCRUD},
		{"WebhookTeamIsolation", testWebhookTeamIsolation},
		{"WebhookDeliveries", testWebhookDeliveries},
		{"WebhookBadInput", testWebhookBadInput},
		{"AuditAppendList", testAuditAppendList},
		{"AuditConcurrent", testAuditConcurrent},
		{"AuditPrune", testAuditPrune},
		{"AuditPersistence", testAuditPersistence},
		{"AuditBadInput", testAuditBadInput},
		{"AuditTamper", testAuditTamper},
		{"Workers", testWorkers},
		{"WorkerProtocol", testWorkerProtocol},
		{"Leases", testLeases},
		{"LeaseExpiry", testLeaseExpiry},
		{"LeaseBadInput", testLeaseBadInput},
		{"Fencing", testFencing},
		{"Quota", testQuota},
		{"QuotaConcurrent", testQuotaConcurrent},
		{"QuotaResume", testQuotaResume},
		{"QuotaResumeConcurrent", testQuotaResumeConcurrent},
		{"Persistence", testPersistence},
		{"BadInput", testBadInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, h) })
	}
}

func open(t *testing.T, h Harness, loc string) store.Store {
	t.Helper()
	s, err := h.Open(t.Context(), loc)
	if err != nil {
		t.Fatalf("setup: open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	return s
}

func fresh(t *testing.T, h Harness) store.Store {
	t.Helper()
	return open(t, h, h.New(t))
}

func mustTeam(t *testing.T, s store.Store, id string) store.Team {
	t.Helper()
	tm, err := s.CreateTeam(t.Context(), store.Team{ID: id, Name: "Team " + id})
	if err != nil {
		t.Fatalf("setup: CreateTeam(%s): %v", id, err)
	}
	return tm
}

func newSandbox(team string) store.Sandbox {
	return store.Sandbox{
		ID:       store.NewSandboxID(),
		TeamID:   team,
		Template: "base",
		State:    store.StateCreating,
		Spec:     json.RawMessage(`{"vcpus":1,"memory_mib":512}`),
	}
}

func mustSandbox(t *testing.T, s store.Store, sb store.Sandbox) store.Sandbox {
	t.Helper()
	got, err := s.CreateSandbox(t.Context(), sb)
	if err != nil {
		t.Fatalf("setup: CreateSandbox(%s): %v", sb.ID, err)
	}
	return got
}

func wantKind(t *testing.T, op string, err error, sentinel error, kind *errkind.Kind) {
	t.Helper()
	if !errors.Is(err, sentinel) || !errors.Is(err, kind) {
		t.Errorf("%s = %v, want %v (kind %v)", op, err, sentinel, kind)
	}
}

func testTeams(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	tm := mustTeam(t, s, "t1")
	if tm.Created.IsZero() {
		t.Errorf("CreateTeam(t1).Created is zero")
	}
	if tm.Quota != nil {
		t.Errorf("CreateTeam(t1).Quota = %q, want nil", tm.Quota)
	}
	got, err := s.Team(ctx, "t1")
	if err != nil {
		t.Fatalf("Team(t1) = %v", err)
	}
	if diff := cmp.Diff(tm, got); diff != "" {
		t.Errorf("Team(t1) (-want +got):\n%s", diff)
	}
	_, err = s.CreateTeam(ctx, store.Team{ID: "t1", Name: "again"})
	wantKind(t, "CreateTeam(duplicate)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.Team(ctx, "nope")
	wantKind(t, "Team(nope)", err, store.ErrNotFound, errkind.NotFound)
}

func testTeamQuota(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	quota := json.RawMessage(`{"sandboxes": 10, "vcpus": 32}`) // kept byte for byte

	in := store.Team{ID: "q", Name: "with quota", Quota: quota}
	withQuota, err := s.CreateTeam(ctx, in)
	if err != nil {
		t.Fatalf("CreateTeam(q) = %v", err)
	}
	want := in
	want.Created = withQuota.Created
	if diff := cmp.Diff(want, withQuota); diff != "" {
		t.Errorf("CreateTeam(q) (-want +got):\n%s", diff)
	}
	got, err := s.Team(ctx, "q")
	if err != nil {
		t.Fatalf("Team(q) = %v", err)
	}
	if diff := cmp.Diff(withQuota, got); diff != "" {
		t.Errorf("Team(q) after create (-want +got):\n%s", diff)
	}

	plain := mustTeam(t, s, "plain")
	for _, step := range []struct {
		name  string
		quota json.RawMessage
	}{
		{"set", json.RawMessage(`{"vcpus":4}`)},
		{"replace", json.RawMessage(`{"vcpus": 8, "memory_mib": 4096}`)},
		{"clear", nil},
		{"set 4 KiB", json.RawMessage(`"` + strings.Repeat("x", 4<<10-2) + `"`)},
		{"clear again", nil},
	} {
		op := fmt.Sprintf("SetTeamQuota(plain) to %s", step.name)
		updated, err := s.SetTeamQuota(ctx, "plain", step.quota)
		if err != nil {
			t.Fatalf("%s = %v", op, err)
		}
		want := plain
		want.Quota = step.quota
		if diff := cmp.Diff(want, updated); diff != "" {
			t.Errorf("%s (-want +got):\n%s", op, diff)
		}
		got, err := s.Team(ctx, "plain")
		if err != nil {
			t.Fatalf("Team(plain) after %s = %v", step.name, err)
		}
		if diff := cmp.Diff(updated, got); diff != "" {
			t.Errorf("Team(plain) after %s (-want +got):\n%s", step.name, diff)
		}
	}

	_, err = s.SetTeamQuota(ctx, "nope", quota)
	wantKind(t, "SetTeamQuota(nope)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.Team(ctx, "nope")
	wantKind(t, "Team(nope) after SetTeamQuota(nope)", err, store.ErrNotFound, errkind.NotFound)

	bad := []struct {
		name  string
		quota json.RawMessage
	}{
		{"truncated", json.RawMessage(`{"vcpus":`)},
		{"not json", json.RawMessage(`nope`)},
		{"empty", json.RawMessage{}},
		{"over 4 KiB", json.RawMessage(`"` + strings.Repeat("x", 4<<10-1) + `"`)},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.SetTeamQuota(ctx, "q", tt.quota)
			wantKind(t, "SetTeamQuota(q, "+tt.name+")", err, store.ErrInvalid, errkind.InvalidArgument)
			_, err = s.CreateTeam(ctx, store.Team{ID: "bad", Quota: tt.quota})
			wantKind(t, "CreateTeam(bad, "+tt.name+")", err, store.ErrInvalid, errkind.InvalidArgument)
		})
	}
	// Nothing was written.
	got, err = s.Team(ctx, "q")
	if err != nil {
		t.Fatalf("Team(q) = %v", err)
	}
	if diff := cmp.Diff(withQuota, got); diff != "" {
		t.Errorf("Team(q) after bad quotas (-want +got):\n%s", diff)
	}
	_, err = s.Team(ctx, "bad")
	wantKind(t, "Team(bad) after bad quotas", err, store.ErrNotFound, errkind.NotFound)
}

func testAPIKeys(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")

	k1, err := s.CreateAPIKey(ctx, store.APIKey{ID: "k1", TeamID: "t1", Name: "ci", Admin: true, Hash: store.HashSecret("secret-1")})
	if err != nil {
		t.Fatalf("CreateAPIKey(k1) = %v", err)
	}
	k2, err := s.CreateAPIKey(ctx, store.APIKey{ID: "k2", TeamID: "t1", Name: "laptop", Hash: store.HashSecret("secret-2")})
	if err != nil {
		t.Fatalf("CreateAPIKey(k2) = %v", err)
	}
	if _, err := s.CreateAPIKey(ctx, store.APIKey{ID: "k3", TeamID: "t2", Hash: store.HashSecret("secret-3")}); err != nil {
		t.Fatalf("CreateAPIKey(k3) = %v", err)
	}

	got, err := s.APIKeyByHash(ctx, store.HashSecret("secret-1"))
	if err != nil {
		t.Fatalf("APIKeyByHash(secret-1) = %v", err)
	}
	if diff := cmp.Diff(k1, got); diff != "" {
		t.Errorf("APIKeyByHash(secret-1) (-want +got):\n%s", diff)
	}
	_, err = s.APIKeyByHash(ctx, store.HashSecret("wrong"))
	wantKind(t, "APIKeyByHash(wrong)", err, store.ErrNotFound, errkind.NotFound)

	list, err := s.ListAPIKeys(ctx, "t1")
	if err != nil {
		t.Fatalf("ListAPIKeys(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.APIKey{k1, k2}, list); diff != "" {
		t.Errorf("ListAPIKeys(t1) (-want +got):\n%s", diff)
	}

	_, err = s.CreateAPIKey(ctx, store.APIKey{ID: "k4", TeamID: "t2", Hash: store.HashSecret("secret-1")})
	wantKind(t, "CreateAPIKey(duplicate hash)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.CreateAPIKey(ctx, store.APIKey{ID: "k1", TeamID: "t2", Hash: store.HashSecret("secret-5")})
	wantKind(t, "CreateAPIKey(duplicate id)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.CreateAPIKey(ctx, store.APIKey{ID: "k5", TeamID: "nope", Hash: store.HashSecret("secret-5")})
	wantKind(t, "CreateAPIKey(unknown team)", err, store.ErrNotFound, errkind.NotFound)

	err = s.DeleteAPIKey(ctx, "t2", "k1")
	wantKind(t, "DeleteAPIKey(other team)", err, store.ErrNotFound, errkind.NotFound)
	if err := s.DeleteAPIKey(ctx, "t1", "k1"); err != nil {
		t.Fatalf("DeleteAPIKey(t1, k1) = %v", err)
	}
	err = s.DeleteAPIKey(ctx, "t1", "k1")
	wantKind(t, "DeleteAPIKey(t1, k1) again", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.APIKeyByHash(ctx, store.HashSecret("secret-1"))
	wantKind(t, "APIKeyByHash(deleted)", err, store.ErrNotFound, errkind.NotFound)
}

func testSandboxCRUD(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")

	in := newSandbox("t1")
	in.Labels = map[string]string{"app": "web"}
	in.Expires = time.Now().Add(time.Hour)
	created := mustSandbox(t, s, in)
	if created.Version != 1 || created.Created.IsZero() || !created.Updated.Equal(created.Created) {
		t.Errorf("CreateSandbox() = version %d, created %v, updated %v; want version 1 and created == updated != zero",
			created.Version, created.Created, created.Updated)
	}
	if !created.Expires.Equal(store.StoredTime(in.Expires)) {
		t.Errorf("CreateSandbox().Expires = %v, want %v", created.Expires, store.StoredTime(in.Expires))
	}

	got, err := s.Sandbox(ctx, "t1", in.ID)
	if err != nil {
		t.Fatalf("Sandbox(%s) = %v", in.ID, err)
	}
	if diff := cmp.Diff(created, got); diff != "" {
		t.Errorf("Sandbox() after create (-want +got):\n%s", diff)
	}
	if got.Handle != nil {
		t.Errorf("Sandbox().Handle = %q, want nil", got.Handle)
	}
	// By ID alone, whatever the team: the same record; an unknown ID is
	// not found.
	byID, err := s.SandboxByID(ctx, in.ID)
	if err != nil {
		t.Fatalf("SandboxByID(%s) = %v", in.ID, err)
	}
	if diff := cmp.Diff(created, byID); diff != "" {
		t.Errorf("SandboxByID() after create (-want +got):\n%s", diff)
	}
	_, err = s.SandboxByID(ctx, newSandbox("t1").ID)
	wantKind(t, "SandboxByID(unknown)", err, store.ErrNotFound, errkind.NotFound)

	_, err = s.CreateSandbox(ctx, in)
	wantKind(t, "CreateSandbox(duplicate)", err, store.ErrAlreadyExists, errkind.Conflict)
	_, err = s.CreateSandbox(ctx, newSandbox("nope"))
	wantKind(t, "CreateSandbox(unknown team)", err, store.ErrNotFound, errkind.NotFound)

	upd := got
	upd.State = store.StateRunning
	upd.WorkerID = "w1"
	upd.Handle = json.RawMessage(`{"pid":42}`)
	upd.Labels = nil
	upd.Expires = time.Time{}
	updated, err := s.UpdateSandbox(ctx, upd)
	if err != nil {
		t.Fatalf("UpdateSandbox() = %v", err)
	}
	want := upd
	want.Version = 2
	want.Updated = updated.Updated
	if diff := cmp.Diff(want, updated); diff != "" {
		t.Errorf("UpdateSandbox() (-want +got):\n%s", diff)
	}
	if updated.Updated.Before(created.Updated) {
		t.Errorf("UpdateSandbox().Updated = %v, before Created %v", updated.Updated, created.Updated)
	}
	got, err = s.Sandbox(ctx, "t1", in.ID)
	if err != nil {
		t.Fatalf("Sandbox(%s) = %v", in.ID, err)
	}
	if diff := cmp.Diff(updated, got); diff != "" {
		t.Errorf("Sandbox() after update (-want +got):\n%s", diff)
	}

	list, err := s.ListSandboxes(ctx, "t1", store.Filter{})
	if err != nil {
		t.Fatalf("ListSandboxes(t1) = %v", err)
	}
	if diff := cmp.Diff([]store.Sandbox{updated}, list); diff != "" {
		t.Errorf("ListSandboxes(t1) (-want +got):\n%s", diff)
	}

	if err := s.DeleteSandbox(ctx, "t1", in.ID); err != nil {
		t.Fatalf("DeleteSandbox() = %v", err)
	}
	_, err = s.Sandbox(ctx, "t1", in.ID)
	wantKind(t, "Sandbox(deleted)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSandbox(ctx, "t1", in.ID)
	wantKind(t, "DeleteSandbox(deleted)", err, store.ErrNotFound, errkind.NotFound)
	_, err = s.UpdateSandbox(ctx, updated)
	wantKind(t, "UpdateSandbox(deleted)", err, store.ErrNotFound, errkind.NotFound)
}

func testTeamIsolation(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "a")
	mustTeam(t, s, "b")
	sb := mustSandbox(t, s, newSandbox("a"))

	_, err := s.Sandbox(ctx, "b", sb.ID)
	wantKind(t, "Sandbox(other team)", err, store.ErrNotFound, errkind.NotFound)
	err = s.DeleteSandbox(ctx, "b", sb.ID)
	wantKind(t, "DeleteSandbox(other team)", err, store.ErrNotFound, errkind.NotFound)
	steal := sb
	steal.TeamID = "b"
	_, err = s.UpdateSandbox(ctx, steal)
	wantKind(t, "UpdateSandbox(other team)", err, store.ErrNotFound, errkind.NotFound)
	list, err := s.ListSandboxes(ctx, "b", store.Filter{})
	if err != nil || len(list) != 0 {
		t.Errorf("ListSandboxes(b) = %d sandboxes, %v; want none", len(list), err)
	}
	got, err := s.Sandbox(ctx, "a", sb.ID)
	if err != nil {
		t.Fatalf("Sandbox(a) = %v", err)
	}
	if diff := cmp.Diff(sb, got); diff != "" {
		t.Errorf("Sandbox(a) after other team's attempts (-want +got):\n%s", diff)
	}
}

func testVersionConflict(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := mustSandbox(t, s, newSandbox("t1"))

	first, second := sb, sb
	first.State = store.StateRunning
	second.State = store.StateFailed
	if _, err := s.UpdateSandbox(ctx, first); err != nil {
		t.Fatalf("UpdateSandbox(first) = %v", err)
	}
	_, err := s.UpdateSandbox(ctx, second)
	wantKind(t, "UpdateSandbox(stale version)", err, store.ErrVersionConflict, errkind.Conflict)
	got, err := s.Sandbox(ctx, "t1", sb.ID)
	if err != nil {
		t.Fatalf("Sandbox() = %v", err)
	}
	if got.State != store.StateRunning || got.Version != 2 {
		t.Errorf("Sandbox() = state %s version %d, want running version 2", got.State, got.Version)
	}
}

func testConcurrentUpdates(t *testing.T, h Harness) {
	const n = 8
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	sb := mustSandbox(t, s, newSandbox("t1"))

	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			u := sb
			u.Labels = map[string]string{"writer": fmt.Sprint(i)}
			_, errs[i] = s.UpdateSandbox(t.Context(), u)
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("UpdateSandbox by writers %d and %d both succeeded at version 1", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrVersionConflict):
			t.Errorf("UpdateSandbox by writer %d = %v, want nil or %v", i, err, store.ErrVersionConflict)
		}
	}
	if winner < 0 {
		t.Fatalf("no UpdateSandbox succeeded")
	}
	got, err := s.Sandbox(t.Context(), "t1", sb.ID)
	if err != nil {
		t.Fatalf("Sandbox() = %v", err)
	}
	if want := fmt.Sprint(winner); got.Version != 2 || got.Labels["writer"] != want {
		t.Errorf("Sandbox() = version %d writer %q, want version 2 writer %q", got.Version, got.Labels["writer"], want)
	}
}

func testConcurrentCreates(t *testing.T, h Harness) {
	const goroutines, each = 8, 10
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				if _, err := s.CreateSandbox(t.Context(), newSandbox("t1")); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent CreateSandbox: %v", err)
	}
	list, err := s.ListSandboxes(t.Context(), "t1", store.Filter{})
	if err != nil {
		t.Fatalf("ListSandboxes() = %v", err)
	}
	if len(list) != goroutines*each {
		t.Errorf("ListSandboxes() = %d sandboxes, want %d", len(list), goroutines*each)
	}
}

func testLabelsFilter(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	mk := func(team string, state store.SandboxState, labels map[string]string) string {
		sb := newSandbox(team)
		sb.State = state
		sb.Labels = labels
		return mustSandbox(t, s, sb).ID
	}
	web := mk("t1", store.StateRunning, map[string]string{"app": "web", "env": "prod"})
	webDev := mk("t1", store.StatePaused, map[string]string{"app": "web", "env": "dev"})
	db := mk("t1", store.StateRunning, map[string]string{"app": "db"})
	bare := mk("t1", store.StateStopped, nil)
	mk("t2", store.StateRunning, map[string]string{"app": "web", "env": "prod"})

	tests := []struct {
		name   string
		filter store.Filter
		want   []string
	}{
		{"all", store.Filter{}, []string{web, webDev, db, bare}},
		{"one label", store.Filter{Labels: map[string]string{"app": "web"}}, []string{web, webDev}},
		{"two labels", store.Filter{Labels: map[string]string{"app": "web", "env": "dev"}}, []string{webDev}},
		{"no match", store.Filter{Labels: map[string]string{"app": "cache"}}, nil},
		{"value must match", store.Filter{Labels: map[string]string{"env": ""}}, nil},
		{"state", store.Filter{States: []store.SandboxState{store.StateRunning}}, []string{web, db}},
		{"states", store.Filter{States: []store.SandboxState{store.StatePaused, store.StateStopped}}, []string{webDev, bare}},
		{"state and label", store.Filter{States: []store.SandboxState{store.StateRunning}, Labels: map[string]string{"app": "web"}}, []string{web}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			list, err := s.ListSandboxes(ctx, "t1", tt.filter)
			if err != nil {
				t.Fatalf("ListSandboxes(%+v) = %v", tt.filter, err)
			}
			var got []string
			for _, sb := range list {
				got = append(got, sb.ID)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ListSandboxes(%+v) IDs (-want +got):\n%s", tt.filter, diff)
			}
		})
	}
}

func testByWorkerAndExpired(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	mustTeam(t, s, "t2")
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	mk := func(team, worker string, state store.SandboxState, expires time.Time) string {
		sb := newSandbox(team)
		sb.WorkerID, sb.State, sb.Expires = worker, state, expires
		return mustSandbox(t, s, sb).ID
	}
	a := mk("t1", "w1", store.StateRunning, now.Add(-time.Minute))
	b := mk("t2", "w1", store.StateRunning, now)
	c := mk("t1", "w2", store.StateRunning, now.Add(time.Microsecond))
	d := mk("t2", "", store.StateCreating, now.Add(-time.Hour))
	mk("t1", "w2", store.StateDeleted, now.Add(-time.Hour))
	mk("t1", "", store.StateRunning, time.Time{})

	ids := func(sbs []store.Sandbox) []string {
		var out []string
		for _, sb := range sbs {
			out = append(out, sb.ID)
		}
		return out
	}
	got, err := s.SandboxesByWorker(ctx, "w1")
	if err != nil {
		t.Fatalf("SandboxesByWorker(w1) = %v", err)
	}
	if diff := cmp.Diff([]string{a, b}, ids(got)); diff != "" {
		t.Errorf("SandboxesByWorker(w1) (-want +got):\n%s", diff)
	}
	got, err = s.ExpiredSandboxes(ctx, now)
	if err != nil {
		t.Fatalf("ExpiredSandboxes() = %v", err)
	}
	if diff := cmp.Diff([]string{d, a, b}, ids(got)); diff != "" {
		t.Errorf("ExpiredSandboxes(now) (-want +got):\n%s", diff)
	}
	got, err = s.ExpiredSandboxes(ctx, now.Add(time.Second))
	if err != nil {
		t.Fatalf("ExpiredSandboxes() = %v", err)
	}
	if diff := cmp.Diff([]string{d, a, b, c}, ids(got)); diff != "" {
		t.Errorf("ExpiredSandboxes(now+1s) (-want +got):\n%s", diff)
	}
	counts, err := s.CountSandboxes(ctx)
	if err != nil {
		t.Fatalf("CountSandboxes() = %v", err)
	}
	want := map[store.SandboxState]int{store.StateRunning: 4, store.StateCreating: 1, store.StateDeleted: 1}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("CountSandboxes() (-want +got):\n%s", diff)
	}
	byTeam, err := s.CountSandboxesByTeam(ctx)
	if err != nil {
		t.Fatalf("CountSandboxesByTeam() = %v", err)
	}
	wantByTeam := map[string]map[store.SandboxState]int{
		"t1": {store.StateRunning: 3},
		"t2": {store.StateRunning: 1, store.StateCreating: 1},
	}
	if diff := cmp.Diff(wantByTeam, byTeam); diff != "" {
		t.Errorf("CountSandboxesByTeam() (-want +got):\n%s", diff)
	}
}

func testWorkers(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	hb := store.StoredTime(time.Now())
	w2 := store.Worker{ID: "w2", Address: "10.0.0.2:7000", VCPUs: 16, MemoryMiB: 65536, LastHeartbeat: hb}
	w1 := store.Worker{ID: "w1", Address: "10.0.0.1:7000", VCPUs: 8, MemoryMiB: 32768, LastHeartbeat: hb}
	for _, w := range []store.Worker{w2, w1} {
		if err := s.UpsertWorker(ctx, w); err != nil {
			t.Fatalf("UpsertWorker(%s) = %v", w.ID, err)
		}
	}
	w1.Address = "10.0.0.9:7000"
	w1.LastHeartbeat = hb.Add(time.Second)
	if err := s.UpsertWorker(ctx, w1); err != nil {
		t.Fatalf("UpsertWorker(w1 again) = %v", err)
	}
	got, err := s.ListWorkers(ctx)
	if err != nil {
		t.Fatalf("ListWorkers() = %v", err)
	}
	if diff := cmp.Diff([]store.Worker{w1, w2}, got); diff != "" {
		t.Errorf("ListWorkers() (-want +got):\n%s", diff)
	}

	// The fencing epoch: raised by compare-and-set only, and kept by
	// a later upsert.
	if e, err := s.RaiseWorkerEpoch(ctx, "w1", 0); err != nil || e != 1 {
		t.Fatalf("RaiseWorkerEpoch(w1, 0) = %d, %v; want 1", e, err)
	}
	if _, err := s.RaiseWorkerEpoch(ctx, "w1", 0); !errors.Is(err, store.ErrVersionConflict) {
		t.Errorf("RaiseWorkerEpoch(w1, 0) again = %v, want ErrVersionConflict", err)
	}
	if _, err := s.RaiseWorkerEpoch(ctx, "nope", 0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RaiseWorkerEpoch(nope) = %v, want ErrNotFound", err)
	}
	w1.Epoch = 99 // ignored
	if err := s.UpsertWorker(ctx, w1); err != nil {
		t.Fatalf("UpsertWorker(w1 with an epoch) = %v", err)
	}
	got, err = s.ListWorkers(ctx)
	if err != nil || len(got) != 2 || got[0].Epoch != 1 || got[1].Epoch != 0 {
		t.Errorf("ListWorkers() after the raise = %+v, %v; want w1 at epoch 1, w2 at 0", got, err)
	}
}

func testPersistence(t *testing.T, h Harness) {
	ctx := t.Context()
	loc := h.New(t)
	s, err := h.Open(ctx, loc)
	if err != nil {
		t.Fatalf("setup: open: %v", err)
	}
	mustTeam(t, s, "t1")
	t1, err := s.SetTeamQuota(ctx, "t1", json.RawMessage(`{"sandboxes": 3}`))
	if err != nil {
		t.Fatalf("SetTeamQuota(t1) = %v", err)
	}
	t2 := mustTeam(t, s, "t2")
	key, err := s.CreateAPIKey(ctx, store.APIKey{ID: "k1", TeamID: "t1", Hash: store.HashSecret("s")})
	if err != nil {
		t.Fatalf("CreateAPIKey() = %v", err)
	}
	sb := newSandbox("t1")
	sb.Labels = map[string]string{"k": "v"}
	sb.Handle = json.RawMessage(`{"pid": 1}`)
	sb = mustSandbox(t, s, sb)
	sn := newSnapshot("t1", sb.ID)
	sn.Name = "kept"
	sn.State = store.SnapshotReady
	sn.Manifest = "m-kept"
	sn.LogicalBytes, sn.NewBytes = 1<<30, 9
	sn.Meta = json.RawMessage(`{"kernel": "6.1"}`)
	sn = mustSnapshot(t, s, sn)
	w := store.Worker{ID: "w1", Address: "unix:///run/w1.sock", VCPUs: 2, MemoryMiB: 1024, LastHeartbeat: store.StoredTime(time.Now())}
	if err := s.UpsertWorker(ctx, w); err != nil {
		t.Fatalf("UpsertWorker() = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close() = %v, want nil", err)
	}

	s = open(t, h, loc)
	for _, want := range []store.Team{t1, t2} {
		got, err := s.Team(ctx, want.ID)
		if err != nil {
			t.Fatalf("Team(%s) after reopen = %v", want.ID, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Team(%s) after reopen (-want +got):\n%s", want.ID, diff)
		}
	}
	gotKey, err := s.APIKeyByHash(ctx, store.HashSecret("s"))
	if err != nil {
		t.Fatalf("APIKeyByHash() after reopen = %v", err)
	}
	if diff := cmp.Diff(key, gotKey); diff != "" {
		t.Errorf("APIKeyByHash() after reopen (-want +got):\n%s", diff)
	}
	gotSB, err := s.Sandbox(ctx, "t1", sb.ID)
	if err != nil {
		t.Fatalf("Sandbox() after reopen = %v", err)
	}
	if diff := cmp.Diff(sb, gotSB); diff != "" {
		t.Errorf("Sandbox() after reopen (-want +got):\n%s", diff)
	}
	gotSN, err := s.SnapshotByName(ctx, "t1", "kept")
	if err != nil {
		t.Fatalf("SnapshotByName() after reopen = %v", err)
	}
	if diff := cmp.Diff(sn, gotSN); diff != "" {
		t.Errorf("SnapshotByName() after reopen (-want +got):\n%s", diff)
	}
	if n, err := s.TeamSnapshotBytes(ctx, "t1"); err != nil || n != 9 {
		t.Errorf("TeamSnapshotBytes(t1) after reopen = %d, %v; want 9", n, err)
	}
	if ms, err := s.AllSnapshotManifests(ctx); err != nil || !cmp.Equal(ms, []string{"m-kept"}) {
		t.Errorf("AllSnapshotManifests() after reopen = %q, %v; want [m-kept]", ms, err)
	}
	dup := newSnapshot("t1", sb.ID)
	dup.Name = "kept"
	_, err = s.CreateSnapshot(ctx, dup)
	wantKind(t, "CreateSnapshot(taken name) after reopen", err, store.ErrAlreadyExists, errkind.Conflict)
	gotW, err := s.ListWorkers(ctx)
	if err != nil {
		t.Fatalf("ListWorkers() after reopen = %v", err)
	}
	if diff := cmp.Diff([]store.Worker{w}, gotW); diff != "" {
		t.Errorf("ListWorkers() after reopen (-want +got):\n%s", diff)
	}
	// The reopened store still writes.
	if _, err := s.CreateSandbox(ctx, newSandbox("t1")); err != nil {
		t.Errorf("CreateSandbox() after reopen = %v", err)
	}
}

func testBadInput(t *testing.T, h Harness) {
	ctx := t.Context()
	s := fresh(t, h)
	mustTeam(t, s, "t1")
	good := newSandbox("t1")
	existing := mustSandbox(t, s, newSandbox("t1"))

	sandbox := func(f func(*store.Sandbox)) store.Sandbox {
		sb := good
		f(&sb)
		return sb
	}
	tests := []struct {
		name string
		op   func() error
	}{
		{"team empty id", func() error { _, err := s.CreateTeam(ctx, store.Team{}); return err }},
		{"team bad id", func() error { _, err := s.CreateTeam(ctx, store.Team{ID: "a b"}); return err }},
		{"key empty id", func() error {
			_, err := s.CreateAPIKey(ctx, store.APIKey{TeamID: "t1", Hash: store.HashSecret("x")})
			return err
		}},
		{"key zero hash", func() error { _, err := s.CreateAPIKey(ctx, store.APIKey{ID: "k", TeamID: "t1"}); return err }},
		{"sandbox empty id", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.ID = "" }))
			return err
		}},
		{"sandbox malformed id", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.ID = "sbx_TOOSHORT" }))
			return err
		}},
		{"sandbox unknown state", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.State = "exploded" }))
			return err
		}},
		{"sandbox empty state", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.State = "" }))
			return err
		}},
		{"sandbox no template", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.Template = "" }))
			return err
		}},
		{"sandbox bad spec", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.Spec = json.RawMessage(`{`) }))
			return err
		}},
		{"sandbox bad handle", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.Handle = json.RawMessage(`nope`) }))
			return err
		}},
		{"sandbox empty label key", func() error {
			_, err := s.CreateSandbox(ctx, sandbox(func(sb *store.Sandbox) { sb.Labels = map[string]string{"": "v"} }))
			return err
		}},
		{"update unknown state", func() error {
			u := existing
			u.State = "exploded"
			_, err := s.UpdateSandbox(ctx, u)
			return err
		}},
		{"list unknown state", func() error {
			_, err := s.ListSandboxes(ctx, "t1", store.Filter{States: []store.SandboxState{"exploded"}})
			return err
		}},
		{"worker empty id", func() error {
			return s.UpsertWorker(ctx, store.Worker{Address: "x", LastHeartbeat: time.Now()})
		}},
		{"worker zero heartbeat", func() error { return s.UpsertWorker(ctx, store.Worker{ID: "w", Address: "x"}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantKind(t, tt.name, tt.op(), store.ErrInvalid, errkind.InvalidArgument)
		})
	}

	// Nothing was written.
	list, err := s.ListSandboxes(ctx, "t1", store.Filter{})
	if err != nil {
		t.Fatalf("ListSandboxes() = %v", err)
	}
	if diff := cmp.Diff([]store.Sandbox{existing}, list); diff != "" {
		t.Errorf("ListSandboxes() after bad input (-want +got):\n%s", diff)
	}
	if keys, err := s.ListAPIKeys(ctx, "t1"); err != nil || len(keys) != 0 {
		t.Errorf("ListAPIKeys() after bad input = %v, %v; want none", keys, err)
	}
	if ws, err := s.ListWorkers(ctx); err != nil || len(ws) != 0 {
		t.Errorf("ListWorkers() after bad input = %v, %v; want none", ws, err)
	}
}
