package worker

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/imagebuild"
	"space/internal/sandbox"
	"space/internal/vmm"
)

// neverBoots is a driver that refuses every boot and finds no VM to
// recover: for tests of what the worker does before and around the VMM.
type neverBoots struct{}

func (neverBoots) Boot(context.Context, vmm.Spec) (vmm.VM, error) {
	return nil, errors.New("neverBoots: no VMs here")
}
func (neverBoots) Recover(context.Context, vmm.Handle) (vmm.VM, error) {
	return nil, vmm.ErrGone
}

type noTemplates struct{}

func (noTemplates) Template(_ context.Context, name string) (*imagebuild.Artifacts, error) {
	return nil, errkind.NotFound
}

func newTestWorker(t *testing.T) *Worker {
	t.Helper()
	w, err := New(Config{ID: "unit", DataDir: t.TempDir(), RunRoot: t.TempDir(), Driver: neverBoots{}, Templates: noTemplates{}, Fencing: true})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatalf("setup: Start = %v", err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestSpecValidate(t *testing.T) {
	ok := Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	tests := []struct {
		name string
		edit func(*Spec)
		want error
	}{
		{"ok", func(*Spec) {}, nil},
		{"no template", func(s *Spec) { s.Template = "" }, errkind.InvalidArgument},
		{"zero vcpus", func(s *Spec) { s.VCPUs = 0 }, errkind.InvalidArgument},
		{"tiny memory", func(s *Spec) { s.MemoryMiB = 1 }, errkind.InvalidArgument},
		{"huge disk", func(s *Spec) { s.DiskMiB = 1 << 40 }, errkind.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.edit(&s)
			if err := validateSpec(s); !errors.Is(err, tt.want) && (err != nil || tt.want != nil) {
				t.Errorf("validate(%+v) = %v, want %v", s, err, tt.want)
			}
		})
	}
}

func TestRecordRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sbx_aaaaaaaaaaaaaaaaaaaa")
	os.Mkdir(dir, 0o700)
	want := record{ID: "sbx_aaaaaaaaaaaaaaaaaaaa", Team: "t", State: sandbox.Running, Created: time.Unix(1, 0).UTC(),
		Spec: Spec{Template: "default", VCPUs: 2, MemoryMiB: 512, DiskMiB: 1024}, Handle: &vmm.Handle{Driver: "qemu", PID: 42}}
	if err := writeRecord(dir, want); err != nil {
		t.Fatalf("writeRecord = %v", err)
	}
	got, err := readRecord(dir)
	if err != nil {
		t.Fatalf("readRecord = %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readRecord (-want +got):\n%s", diff)
	}
	// A record that names another sandbox, or is not JSON, is refused.
	other := filepath.Join(t.TempDir(), "sbx_bbbbbbbbbbbbbbbbbbbb")
	os.Mkdir(other, 0o700)
	writeRecord(other, want)
	if _, err := readRecord(other); err == nil {
		t.Errorf("readRecord of a record in another sandbox's directory = nil error")
	}
	os.WriteFile(filepath.Join(dir, recordFile), []byte("{"), 0o600)
	if _, err := readRecord(dir); err == nil {
		t.Errorf("readRecord of corrupt JSON = nil error")
	}
}

// TestCreateBadInputChangesNothing checks Create refuses bad ids, teams,
// specs and templates before it touches the host.
func TestCreateBadInputChangesNothing(t *testing.T) {
	w := newTestWorker(t)
	spec := Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024}
	tests := []struct {
		name, id, team string
		spec           Spec
		want           error
	}{
		{"bad id", "../etc", "t", spec, errkind.InvalidArgument},
		{"bad team", "sbx_aaaaaaaaaaaaaaaaaaaa", "a/b", spec, errkind.InvalidArgument},
		{"bad spec", "sbx_aaaaaaaaaaaaaaaaaaaa", "t", Spec{Template: "default"}, errkind.InvalidArgument},
		{"unknown template", "sbx_aaaaaaaaaaaaaaaaaaaa", "t", spec, errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := w.Create(t.Context(), CreateRequest{ID: tt.id, Team: tt.team, Spec: tt.spec}); !errors.Is(err, tt.want) {
				t.Errorf("Create = %v, want %v", err, tt.want)
			}
		})
	}
	if entries, _ := os.ReadDir(w.sandboxesDir()); len(entries) != 0 {
		t.Errorf("sandbox directories after refused creates: %v", entries)
	}
	if got, err := w.List(t.Context()); err != nil || len(got) != 0 {
		t.Errorf("List() = %v, %v; want none", got, err)
	}
}

// TestStartRemovesLeftovers checks a worker removes directories no record
// explains, and rolls back a create that never got a VM.
func TestStartRemovesLeftovers(t *testing.T) {
	data, run := t.TempDir(), t.TempDir()
	sbxDir := filepath.Join(data, "sandboxes")
	os.MkdirAll(filepath.Join(sbxDir, "sbx_cccccccccccccccccccc", "disk"), 0o700) // no record
	os.MkdirAll(filepath.Join(run, "sbx_dddddddddddddddddddd"), 0o700)            // no record
	half := filepath.Join(sbxDir, "sbx_eeeeeeeeeeeeeeeeeeee")
	os.MkdirAll(half, 0o700)
	writeRecord(half, record{ID: "sbx_eeeeeeeeeeeeeeeeeeee", Team: "t", State: sandbox.Creating})
	gone := filepath.Join(sbxDir, "sbx_ffffffffffffffffffff") // ran, and its VM died meanwhile
	os.MkdirAll(gone, 0o700)
	writeRecord(gone, record{ID: "sbx_ffffffffffffffffffff", Team: "t", State: sandbox.Running, Handle: &vmm.Handle{Driver: "qemu", PID: 1}})

	// Warm templates: one without a NIC (from before every sandbox had
	// one) goes; one with a NIC stays.
	for name, net := range map[string]*Network{"default-1c-256m-1024d-old": nil, "default-1c-256m-1024d-new": {}} {
		dir := filepath.Join(data, "warm", name)
		os.MkdirAll(filepath.Join(dir, "vm"), 0o700)
		writeJSONFile(dir, snapshotInfoFile, SnapshotInfo{ID: "warm", Spec: Spec{Template: "default", Network: net}})
	}

	w, err := New(Config{ID: "unit", DataDir: data, RunRoot: run, Driver: neverBoots{}, Templates: noTemplates{}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer w.Close()
	if err := w.Start(t.Context()); err != nil {
		t.Fatalf("Start = %v", err)
	}
	var names []string
	entries, _ := os.ReadDir(sbxDir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"sbx_ffffffffffffffffffff"}, names); diff != "" {
		t.Errorf("sandbox dirs after Start (-want +got):\n%s", diff)
	}
	if entries, _ := os.ReadDir(run); len(entries) != 0 {
		t.Errorf("run dirs after Start: %v", entries)
	}
	if m, _ := filepath.Glob(filepath.Join(data, "warm", "*")); len(m) != 1 || filepath.Base(m[0]) != "default-1c-256m-1024d-new" {
		t.Errorf("warm templates after Start: %v, want only the one with a NIC", m)
	}
	inf, err := w.Sandbox(t.Context(), "sbx_ffffffffffffffffffff")
	if err != nil || inf.State != sandbox.Failed || inf.Error == "" {
		t.Errorf("Sandbox(lost vm) = %+v, %v; want failed with a reason", inf, err)
	}
	if err := w.Delete(t.Context(), "sbx_ffffffffffffffffffff"); err != nil {
		t.Errorf("Delete(failed) = %v", err)
	}
	if entries, _ := os.ReadDir(sbxDir); len(entries) != 0 {
		t.Errorf("sandbox dirs after Delete: %v", entries)
	}
}

func TestHandlerToken(t *testing.T) {
	w := newTestWorker(t)
	h := w.Handler("s3cret")
	for _, tc := range []struct {
		auth string
		want int
	}{{"", 401}, {"Bearer nope", 401}, {"Bearer s3cret", 200}} {
		req := httptest.NewRequest("GET", PathPrefix+"/status", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("GET status with %q = %d, want %d", tc.auth, rec.Code, tc.want)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", PathPrefix+"/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/exec", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest && rec.Code != http.StatusNotFound {
		t.Errorf("exec on unknown sandbox = %d, want 4xx", rec.Code)
	}
}
