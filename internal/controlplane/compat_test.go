package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/api"
	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/worker"
	"space/internal/workerproto"
)

// vmmWorker is a worker without VMs that states a VMM kind and version,
// says its sandboxes' VMs run that VMM, counts the memory they use
// against memMiB, takes chunked snapshots (local ones when asked), and
// keeps what it was asked to create and restore.
type vmmWorker struct {
	instantWorker
	id   string
	caps workerproto.Capabilities
	// vmVMM overrides the VMM its VMs say they run (an older worker's VM
	// that names none: "none"); "" = caps'.
	vmVMM string
	// diskMiB is the storage it reports (Status.DiskMiB), set before
	// use; 0 = none.
	diskMiB int64

	mu sync.Mutex
	// +checklocks:mu
	memMiB int64
	// +checklocks:mu
	specs map[string]worker.Spec // running sandboxes
	// +checklocks:mu
	creates []worker.CreateRequest
	// +checklocks:mu
	restores []string // sandbox/snapshot
}

func newVMMWorker(id, kind, version string, memMiB int64) *vmmWorker {
	accel := "kvm"
	if kind == "fake" {
		accel = "none"
	}
	return &vmmWorker{id: id, memMiB: memMiB, specs: map[string]worker.Spec{},
		caps: workerproto.Capabilities{VMM: kind, VMMVersion: version, Accel: accel, Snapshots: true, ChunkedSnapshots: true, NICs: []string{workerproto.NICSocket}}}
}

func (w *vmmWorker) ID() string { return w.id }

func (w *vmmWorker) vm(startedBy string) *api.VMInfo {
	vm := &api.VMInfo{VMM: w.caps.VMM, VMMVersion: w.caps.VMMVersion, Accel: w.caps.Accel, StartedBy: startedBy}
	if w.vmVMM != "" {
		vm = &api.VMInfo{VMM: w.vmVMM, StartedBy: startedBy}
	}
	return vm
}

func (w *vmmWorker) Create(_ context.Context, req worker.CreateRequest) (worker.Info, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.creates = append(w.creates, req)
	sp := req.Spec
	if sp.MemoryMiB == 0 {
		sp = worker.Spec{Template: "default", VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096}
	}
	w.specs[req.ID] = sp
	by := "boot"
	if req.FromSnapshot != "" {
		by = "restore"
	}
	return worker.Info{ID: req.ID, Team: req.Team, State: sandbox.Running, Spec: sp, VM: w.vm(by)}, nil
}

func (w *vmmWorker) Delete(_ context.Context, id string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.specs, id)
	return nil
}

func (w *vmmWorker) Snapshot(_ context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sp, ok := w.specs[id]
	if !ok {
		return worker.SnapshotInfo{}, fmt.Errorf("sandbox %s: %w", id, errkind.NotFound)
	}
	return worker.SnapshotInfo{ID: req.SnapshotID, SandboxID: id, Spec: sp, Chunked: !req.Local}, nil
}

func (w *vmmWorker) Restore(_ context.Context, id, snap string) (worker.Info, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.restores = append(w.restores, id+"/"+snap)
	return worker.Info{ID: id, State: sandbox.Running, Spec: w.specs[id], VM: w.vm("restore")}, nil
}

func (w *vmmWorker) Sandbox(_ context.Context, id string) (worker.Info, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sp, ok := w.specs[id]
	if !ok {
		return worker.Info{}, fmt.Errorf("sandbox %s: %w", id, errkind.NotFound)
	}
	return worker.Info{ID: id, State: sandbox.Running, Spec: sp, VM: w.vm("boot")}, nil
}

func (w *vmmWorker) Status(context.Context) (worker.Status, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var used, disk int64
	for _, sp := range w.specs {
		used += sp.MemoryMiB
		disk += sp.DiskMiB
	}
	st := worker.Status{ID: w.id, Protocol: workerproto.Version, Capabilities: w.caps,
		VCPUs: 64, MemoryMiB: w.memMiB, UsedMemoryMiB: used, Sandboxes: len(w.specs)}
	if w.diskMiB > 0 {
		st.DiskMiB, st.FreeDiskMiB = w.diskMiB, max(0, w.diskMiB-disk)
	}
	return st, nil
}

// asked returns the IDs of the sandboxes the worker was asked to create
// and the restores it was asked for.
func (w *vmmWorker) asked() (creates, restores []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.creates {
		creates = append(creates, c.ID)
	}
	return creates, slices.Clone(w.restores)
}

// running returns the IDs of the sandboxes the worker runs.
func (w *vmmWorker) running() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ids []string
	for id := range w.specs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// compatServer returns a server with the given workers (healthy), and a
// func that sends a request with the admin's API key.
func compatServer(t *testing.T, workers ...Worker) (*Server, store.Store, func(method, path, body string) (int, []byte)) {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Templates: []string{"default"}})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, wk := range workers {
		connect(s, wk)
	}
	return s, st, adminCaller(t, s)
}

// connect adds wk to s with a heartbeat that stays fresh.
func connect(s *Server, wk Worker) {
	s.AddWorker(wk)
	s.mu.Lock()
	s.seen[wk.ID()] = time.Now().Add(time.Hour)
	s.mu.Unlock()
}

// disconnectWorker drops wk from s, as if it had never registered.
func disconnectWorker(s *Server, wk Worker) {
	s.mu.Lock()
	delete(s.workers, wk.ID())
	delete(s.probes, wk.ID())
	s.mu.Unlock()
}

// decode unmarshals body into a new T, failing the test if it does not
// decode or code is not want.
func decode[T any](t *testing.T, what string, code int, body []byte, want int) T {
	t.Helper()
	var v T
	if code != want {
		t.Fatalf("%s = %d %s, want %d", what, code, body, want)
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s: decode %s: %v", what, body, err)
	}
	return v
}

// takeSnapshot creates a sandbox (placed on the one worker connected)
// and a snapshot of it, named name.
func takeSnapshot(t *testing.T, do func(method, path, body string) (int, []byte), name string) (api.Sandbox, api.Snapshot) {
	t.Helper()
	code, body := do("POST", "/v1/sandboxes", `{}`)
	sb := decode[api.Sandbox](t, "setup: create", code, body, 201)
	code, body = do("POST", "/v1/sandboxes/"+sb.ID+"/snapshots", fmt.Sprintf(`{"name":%q}`, name))
	return sb, decode[api.Snapshot](t, "setup: snapshot", code, body, 201)
}

func TestVMMMatch(t *testing.T) {
	qemu72 := vmmID{Kind: "qemu", Version: "7.2.19", Accel: "kvm"}
	tests := []struct {
		name      string
		taken     vmmID
		caps      workerproto.Capabilities
		ok, exact bool
	}{
		{"same kind and version", qemu72, workerproto.Capabilities{VMM: "qemu", VMMVersion: "7.2.19", Accel: "tcg"}, true, true},
		{"other version", qemu72, workerproto.Capabilities{VMM: "qemu", VMMVersion: "8.2.0"}, false, false},
		{"other patch release", qemu72, workerproto.Capabilities{VMM: "qemu", VMMVersion: "7.2.20"}, false, false},
		{"other kind", qemu72, workerproto.Capabilities{VMM: "firecracker", VMMVersion: "7.2.19"}, false, false},
		{"fake is its own kind", vmmID{Kind: "fake", Version: "1"}, workerproto.Capabilities{VMM: "qemu", VMMVersion: "1"}, false, false},
		{"worker states no kind", qemu72, workerproto.Capabilities{}, false, false},
		{"worker's version not known", qemu72, workerproto.Capabilities{VMM: "qemu"}, true, false},
		{"snapshot's version not known", vmmID{Kind: "qemu"}, workerproto.Capabilities{VMM: "qemu", VMMVersion: "8.2.0"}, true, true},
		{"snapshot records none", vmmID{}, workerproto.Capabilities{VMM: "firecracker", VMMVersion: "1.10.1"}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ok, exact := tt.taken.match(tt.caps); ok != tt.ok || exact != tt.exact {
				t.Errorf("%+v.match(%+v) = %v, %v; want %v, %v", tt.taken, tt.caps, ok, exact, tt.ok, tt.exact)
			}
		})
	}
}

func TestTakenBy(t *testing.T) {
	caps := &workerproto.Capabilities{VMM: "qemu", VMMVersion: "8.2.0", Accel: "tcg"}
	tests := []struct {
		name string
		vm   *api.VMInfo
		caps *workerproto.Capabilities
		want vmmID
	}{
		{"the vm's, which may predate its worker's upgrade", &api.VMInfo{VMM: "qemu", VMMVersion: "7.2.19", Accel: "kvm"}, caps, vmmID{"qemu", "7.2.19", "kvm"}},
		{"the worker's when the vm names no known kind", &api.VMInfo{VMM: "none"}, caps, vmmID{"qemu", "8.2.0", "tcg"}},
		{"the worker's without a vm", nil, caps, vmmID{"qemu", "8.2.0", "tcg"}},
		{"nothing when neither says", &api.VMInfo{VMM: "none"}, &workerproto.Capabilities{}, vmmID{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := takenBy(tt.vm, tt.caps); got != tt.want {
				t.Errorf("takenBy(%+v, %+v) = %+v, want %+v", tt.vm, tt.caps, got, tt.want)
			}
		})
	}
}

// TestSnapshotRecordsVMM checks a snapshot's metadata and view name the
// VMM that took it: its VM's, or its worker's when the VM names none.
func TestSnapshotRecordsVMM(t *testing.T) {
	for _, vmSays := range []bool{true, false} {
		t.Run(fmt.Sprintf("vm says=%v", vmSays), func(t *testing.T) {
			qa := newVMMWorker("qa", "qemu", "7.2.19", 4096)
			if !vmSays {
				qa.vmVMM = "none"
			}
			_, st, do := compatServer(t, qa)
			_, snap := takeSnapshot(t, do, "s1")
			if snap.VMM != "qemu" || snap.VMMVersion != "7.2.19" {
				t.Errorf("snapshot view VMM = %q %q, want qemu 7.2.19", snap.VMM, snap.VMMVersion)
			}
			sn, err := st.Snapshot(t.Context(), DefaultTeam, snap.ID)
			if err != nil {
				t.Fatalf("Snapshot = %v", err)
			}
			m, err := metaOf(sn)
			if err != nil {
				t.Fatalf("metaOf = %v", err)
			}
			if want := (vmmID{Kind: "qemu", Version: "7.2.19", Accel: "kvm"}); m.VMM != want {
				t.Errorf("stored VMM = %+v, want %+v", m.VMM, want)
			}
		})
	}
}

// TestRestoreOnlyOnSameVMM checks sandboxes from a snapshot taken on a
// qemu 7.2.19 worker (a create from it, a fork's children, a resume)
// start only on qemu 7.2.19 workers, though workers of another VMM
// kind or version have more room; one whose version is not known is
// taken only when no exact match has room.
func TestRestoreOnlyOnSameVMM(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 1024) // the parent and one more
	s, _, do := compatServer(t, qa)
	parent, snap := takeSnapshot(t, do, "s1")
	qa2 := newVMMWorker("qa2", "qemu", "7.2.19", 2048)
	qb := newVMMWorker("qb", "qemu", "8.2.0", 1<<20)
	fc := newVMMWorker("fc", "firecracker", "1.10.1", 1<<20)
	fk := newVMMWorker("fk", "fake", "1", 1<<20)
	for _, wk := range []Worker{qa2, qb, fc, fk} {
		connect(s, wk)
	}

	// A create from it goes to the matching worker with the most room.
	code, body := do("POST", "/v1/sandboxes", `{"from_snapshot":"s1"}`)
	if got := decode[api.Sandbox](t, "create from s1", code, body, 201); got.Worker != "qa2" {
		t.Errorf("create from a qemu 7.2.19 snapshot went to %s, want qa2", got.Worker)
	}
	// qa has room for one more, not for a fork of 2: its children go
	// through the chunk store, to matching workers.
	code, body = do("POST", "/v1/sandboxes/"+parent.ID+"/fork", `{"count":2}`)
	children := decode[api.SandboxList](t, "fork of 2", code, body, 201)
	for _, c := range children.Sandboxes {
		if c.Worker != "qa" && c.Worker != "qa2" {
			t.Errorf("fork child %s went to %s, want qa or qa2", c.ID, c.Worker)
		}
	}
	// A suspended child resumes on a matching worker.
	code, body = do("POST", "/v1/sandboxes/"+children.Sandboxes[0].ID+"/suspend", "")
	decode[api.Sandbox](t, "suspend", code, body, 200)
	code, body = do("POST", "/v1/sandboxes/"+children.Sandboxes[0].ID+"/resume", "")
	if got := decode[api.Sandbox](t, "resume", code, body, 200); got.Worker != "qa" && got.Worker != "qa2" {
		t.Errorf("resume of a qemu 7.2.19 suspend went to %s, want qa or qa2", got.Worker)
	}
	for _, wk := range []*vmmWorker{qb, fc, fk} {
		if creates, restores := wk.asked(); len(creates)+len(restores) != 0 {
			t.Errorf("worker %s (%s) was asked to create %q and restore %q, want nothing", wk.id, capsString(wk.caps), creates, restores)
		}
	}

	// A qemu worker whose version is not known takes it only once the
	// exact matches are full: qa and qa2 have room for 2 more (1024 +
	// 2048 MiB, 4 sandboxes of 512).
	qx := newVMMWorker("qx", "qemu", "", 1<<20)
	connect(s, qx)
	for range 2 {
		code, body = do("POST", "/v1/sandboxes", `{"from_snapshot":"`+snap.ID+`"}`)
		if got := decode[api.Sandbox](t, "create from s1 with a version-unknown qemu worker", code, body, 201); got.Worker != "qa" && got.Worker != "qa2" {
			t.Errorf("create went to %s, want an exact match (qa or qa2) while one has room", got.Worker)
		}
	}
	code, body = do("POST", "/v1/sandboxes", `{"from_snapshot":"s1"}`)
	if got := decode[api.Sandbox](t, "create from s1 with the exact matches full", code, body, 201); got.Worker != "qx" {
		t.Errorf("create with the exact matches full went to %s, want qx", got.Worker)
	}
}

// TestRestoreWithoutMatchingWorker checks that with only a firecracker
// worker connected, a create from, a restore to and a resume from a
// qemu snapshot fail saying so, and change nothing: no record left, no
// worker asked.
func TestRestoreWithoutMatchingWorker(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 4096)
	s, st, do := compatServer(t, qa)
	_, snap := takeSnapshot(t, do, "s1")
	code, body := do("POST", "/v1/sandboxes", `{}`)
	suspended := decode[api.Sandbox](t, "setup: create", code, body, 201)
	code, body = do("POST", "/v1/sandboxes/"+suspended.ID+"/suspend", "")
	decode[api.Sandbox](t, "setup: suspend", code, body, 200)
	disconnectWorker(s, qa)
	fc := newVMMWorker("fc", "firecracker", "1.10.1", 1<<20)
	connect(s, fc)
	code, body = do("POST", "/v1/sandboxes", `{}`)
	onFC := decode[api.Sandbox](t, "setup: create on fc", code, body, 201)

	records := func() []store.Sandbox {
		all, err := st.ListSandboxes(t.Context(), DefaultTeam, store.Filter{})
		if err != nil {
			t.Fatalf("ListSandboxes = %v", err)
		}
		return all
	}
	before := records()
	wantMsg := "snapshot " + snap.ID + " was taken by qemu 7.2.19; no connected worker runs qemu 7.2.19 (workers: fc firecracker 1.10.1)"
	tests := []struct {
		name, path, body, want string
	}{
		{"create from it", "/v1/sandboxes", `{"from_snapshot":"s1"}`, wantMsg},
		{"restore to it", "/v1/sandboxes/" + onFC.ID + "/restore", `{"snapshot":"s1"}`,
			"snapshot " + snap.ID + " was taken by qemu 7.2.19; sandbox " + onFC.ID + " runs on worker fc, which runs firecracker 1.10.1"},
		{"resume from it", "/v1/sandboxes/" + suspended.ID + "/resume", ``, "was taken by qemu 7.2.19; no connected worker runs qemu 7.2.19 (workers: fc firecracker 1.10.1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do("POST", tt.path, tt.body)
			e := decode[api.Error](t, tt.name, code, body, 409)
			if e.Error.Code != api.CodeFailedPrecondition || !strings.Contains(e.Error.Message, tt.want) {
				t.Errorf("%s = %s, want failed_precondition saying %q", tt.name, body, tt.want)
			}
			if diff := cmp.Diff(before, records()); diff != "" {
				t.Errorf("records after a refused %s (-before +after):\n%s", tt.name, diff)
			}
			creates, restores := fc.asked()
			if !slices.Equal(creates, []string{onFC.ID}) || len(restores) != 0 {
				t.Errorf("fc was asked to create %q and restore %q, want only %s created", creates, restores, onFC.ID)
			}
			if got := fc.running(); !slices.Equal(got, []string{onFC.ID}) {
				t.Errorf("fc runs %q, want only %s", got, onFC.ID)
			}
		})
	}

	// A qemu 7.2.19 worker known but unhealthy: that is Unavailable.
	connect(s, qa)
	s.mu.Lock()
	s.seen[qa.ID()] = time.Now().Add(-2 * HeartbeatTimeout)
	s.probes[qa.ID()] = &probe{status: worker.Status{ID: "qa", Capabilities: qa.caps}, answered: true, at: time.Now()}
	s.mu.Unlock()
	code, body = do("POST", "/v1/sandboxes", `{"from_snapshot":"s1"}`)
	e := decode[api.Error](t, "create with the matching worker unhealthy", code, body, 503)
	if want := "the workers that run it (qa) are unhealthy"; e.Error.Code != api.CodeUnavailable || !strings.Contains(e.Error.Message, want) {
		t.Errorf("create with the matching worker unhealthy = %s, want unavailable saying %q", body, want)
	}
}

// TestRestoreNoRoomOnMatchingWorker checks a create from a snapshot
// whose matching workers are full is Unavailable, saying so, though a
// worker of another version has room.
func TestRestoreNoRoomOnMatchingWorker(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 512) // room for the parent only
	s, _, do := compatServer(t, qa)
	_, snap := takeSnapshot(t, do, "s1")
	qb := newVMMWorker("qb", "qemu", "8.2.0", 1<<20)
	connect(s, qb)
	code, body := do("POST", "/v1/sandboxes", `{"from_snapshot":"s1"}`)
	e := decode[api.Error](t, "create from s1", code, body, 503)
	want := "no worker running qemu 7.2.19 (which took snapshot " + snap.ID + ") has 1 vcpus, 512 MiB of memory and 4096 MiB of disk free"
	if e.Error.Code != api.CodeUnavailable || !strings.Contains(e.Error.Message, want) {
		t.Errorf("create from s1 with qa full = %s, want unavailable saying %q", body, want)
	}
	if creates, _ := qb.asked(); len(creates) != 0 {
		t.Errorf("qb was asked to create %q, want nothing", creates)
	}
}

// TestTemplateOnlyOnItsVMM checks a template whose snapshot was taken on
// a qemu worker starts sandboxes only on qemu workers of its version,
// and fails clearly with only a firecracker worker connected.
func TestTemplateOnlyOnItsVMM(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 4096)
	s, st, do := compatServer(t, qa)
	_, snap := takeSnapshot(t, do, "tpl")
	ctx := t.Context()
	tpl, err := st.CreateTemplate(ctx, store.Template{TeamID: DefaultTeam, Name: "py", State: store.TemplateBuilding})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	meta, _ := json.Marshal(templateMeta{Spec: worker.Spec{Template: "default", VCPUs: 1, MemoryMiB: 512, DiskMiB: 4096}})
	if _, err := s.setTemplateState(ctx, tpl, store.TemplateReady, func(t *store.Template) { t.SnapshotID, t.Meta = snap.ID, meta }); err != nil {
		t.Fatalf("setup: %v", err)
	}
	fc := newVMMWorker("fc", "firecracker", "1.10.1", 1<<20)
	qb := newVMMWorker("qb", "qemu", "8.2.0", 1<<20)
	connect(s, fc)
	connect(s, qb)
	for range 2 {
		code, body := do("POST", "/v1/sandboxes", `{"template":"py"}`)
		if got := decode[api.Sandbox](t, "create from template py", code, body, 201); got.Worker != "qa" {
			t.Errorf("create from a template built on qemu 7.2.19 went to %s, want qa", got.Worker)
		}
	}
	disconnectWorker(s, qa)
	code, body := do("POST", "/v1/sandboxes", `{"template":"py"}`)
	e := decode[api.Error](t, "create from template py without qa", code, body, 409)
	want := "snapshot " + snap.ID + " was taken by qemu 7.2.19; no connected worker runs qemu 7.2.19 (workers: fc firecracker 1.10.1, qb qemu 8.2.0)"
	if e.Error.Code != api.CodeFailedPrecondition || !strings.Contains(e.Error.Message, want) {
		t.Errorf("create from template py without qa = %s, want failed_precondition saying %q", body, want)
	}
	for _, wk := range []*vmmWorker{fc, qb} {
		if creates, _ := wk.asked(); len(creates) != 0 {
			t.Errorf("worker %s was asked to create %q, want nothing", wk.id, creates)
		}
	}
}

// TestOldSnapshotRestoresAnywhere checks a snapshot whose metadata
// predates the VMM record starts on any worker, and restores in place.
func TestOldSnapshotRestoresAnywhere(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 4096)
	s, st, do := compatServer(t, qa)
	_, snap := takeSnapshot(t, do, "old")
	sn, err := st.Snapshot(t.Context(), DefaultTeam, snap.ID)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	sn.Meta = json.RawMessage(`{"spec":{"template":"default","vcpus":1,"memory_mib":512,"disk_mib":4096},"paused_ms":3,"chunked":true}`)
	if _, err := st.UpdateSnapshot(t.Context(), sn); err != nil {
		t.Fatalf("setup: write old metadata: %v", err)
	}
	disconnectWorker(s, qa)
	fc := newVMMWorker("fc", "firecracker", "1.10.1", 1<<20)
	connect(s, fc)
	code, body := do("GET", "/v1/snapshots/old", "")
	if v := decode[api.Snapshot](t, "GET old snapshot", code, body, 200); v.VMM != "" || v.VMMVersion != "" {
		t.Errorf("old snapshot's view VMM = %q %q, want none", v.VMM, v.VMMVersion)
	}
	code, body = do("POST", "/v1/sandboxes", `{"from_snapshot":"old"}`)
	got := decode[api.Sandbox](t, "create from an old snapshot", code, body, 201)
	if got.Worker != "fc" {
		t.Errorf("create from an old snapshot went to %s, want fc", got.Worker)
	}
	code, body = do("POST", "/v1/sandboxes/"+got.ID+"/restore", `{"snapshot":"old"}`)
	decode[api.Sandbox](t, "restore an old snapshot", code, body, 200)
	if _, restores := fc.asked(); !slices.Equal(restores, []string{got.ID + "/" + snap.ID}) {
		t.Errorf("fc restores = %q, want %s/%s", restores, got.ID, snap.ID)
	}
}

// TestLocalForkNeedsSameVMM checks a fork whose parent's VM runs an older
// VMM than its worker now does (upgraded under it) does not place its
// children on that worker from a local snapshot, but through the chunk
// store on a worker that runs the parent's VMM.
func TestLocalForkNeedsSameVMM(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 1<<20)
	s, _, do := compatServer(t, qa)
	code, body := do("POST", "/v1/sandboxes", `{}`)
	parent := decode[api.Sandbox](t, "setup: create", code, body, 201)
	qa.mu.Lock()
	qa.caps.VMMVersion = "8.2.0" // its VMM was upgraded; the parent's VM runs 7.2.19 still
	qa.mu.Unlock()
	old := newVMMWorker("old", "qemu", "7.2.19", 4096)
	connect(s, old)
	code, body = do("POST", "/v1/sandboxes/"+parent.ID+"/fork", `{"count":1}`)
	children := decode[api.SandboxList](t, "fork", code, body, 201)
	if len(children.Sandboxes) != 1 || children.Sandboxes[0].Worker != "old" {
		t.Errorf("fork children = %+v, want one on old (qemu 7.2.19)", children.Sandboxes)
	}
	creates, _ := old.asked()
	if len(creates) != 1 {
		t.Fatalf("old was asked to create %q, want the child", creates)
	}
	old.mu.Lock()
	take := old.creates[0].TakeSnapshot
	old.mu.Unlock()
	if take {
		t.Errorf("the child's create takes the snapshot, want a restore from the chunk store")
	}
}

// TestWorkersShowVMM checks GET /v1/workers shows each worker's VMM kind
// and version.
func TestWorkersShowVMM(t *testing.T) {
	qa := newVMMWorker("qa", "qemu", "7.2.19", 4096)
	fc := newVMMWorker("fc", "firecracker", "1.10.1", 4096)
	_, _, do := compatServer(t, qa, fc)
	code, body := do("GET", "/v1/workers", "")
	var got []string
	for _, w := range decode[api.WorkerList](t, "GET /v1/workers", code, body, 200).Workers {
		if w.Capabilities == nil {
			t.Errorf("worker %s shows no capabilities", w.ID)
			continue
		}
		got = append(got, w.ID+" "+w.Capabilities.VMM+" "+w.Capabilities.VMMVersion+" "+w.Capabilities.Accel)
	}
	if want := []string{"fc firecracker 1.10.1 kvm", "qa qemu 7.2.19 kvm"}; !slices.Equal(got, want) {
		t.Errorf("GET /v1/workers VMMs = %q, want %q", got, want)
	}
}
