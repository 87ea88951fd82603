package controlplane

import (
	"path/filepath"
	"testing"

	"space/internal/store"
	"space/internal/store/sqlite"
)

// TestReconcileLeavesNewBuild: a version a build has just created, before
// the build claims it by number, is not taken for one a crash
// interrupted; once nothing claims it, reconcile settles it as failed.
func TestReconcileLeavesNewBuild(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer st.Close()
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := st.CreateTeam(ctx, store.Team{ID: "t1", Name: "t1"}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	_, release, err := s.claim(ctx, buildNameClaim("t1", "web")+store.NewID("b"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	tpl, err := st.CreateTemplate(ctx, store.Template{TeamID: "t1", Name: "web", State: store.TemplateBuilding})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("reconcileTemplates = %v", err)
	}
	if got, err := st.Template(ctx, "t1", "web", tpl.Version); err != nil || got.State != store.TemplateBuilding {
		t.Errorf("a version whose build holds its name = %+v, %v; want it still building", got, err)
	}
	release()
	if err := s.Reconcile(ctx); err != nil {
		t.Fatalf("reconcileTemplates = %v", err)
	}
	if got, err := st.Template(ctx, "t1", "web", tpl.Version); err != nil || got.State != store.TemplateFailed {
		t.Errorf("an unclaimed building version after reconcile = %+v, %v; want failed", got, err)
	}
}
