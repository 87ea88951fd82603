package firecracker

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"space/internal/errkind"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// TestSnapshotRestoreAgainstFakeFirecracker takes full and diff snapshots
// of a booted VM and restores one into a fresh process.
func TestSnapshotRestoreAgainstFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	ctx := t.Context()
	snaps := shortTempDir(t, "fcsnap")
	full, diff := filepath.Join(snaps, "full"), filepath.Join(snaps, "diff")

	if _, err := v.Snapshot(ctx, full, false); !errors.Is(err, ErrNotPaused) {
		t.Fatalf("Snapshot of a running vm = %v, want ErrNotPaused", err)
	}
	if err := v.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	md, err := v.Snapshot(ctx, full, false)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	want := &Metadata{
		Format: 1, Driver: "firecracker", FirecrackerVersion: "1.16.1", Type: "Full", Loadable: true,
		HostCPU: hostCPU(), HostKernel: hostKernel(), VMState: "vmstate", Memory: "memory",
		Layout: v.st.Layout,
	}
	if diff := cmp.Diff(want, md, cmpopts.IgnoreFields(Metadata{}, "Created")); diff != "" {
		t.Errorf("Snapshot metadata (-want +got):\n%s", diff)
	}
	onDisk, err := ReadMetadata(full)
	if err != nil {
		t.Fatalf("ReadMetadata: %v", err)
	}
	if diff := cmp.Diff(md, onDisk); diff != "" {
		t.Errorf("ReadMetadata (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(filepath.Join(full, "memory")); err != nil || fi.Size() != 256<<20 {
		t.Errorf("memory file = %v, %v; want 256 MiB", fi, err)
	}
	if _, err := v.Snapshot(ctx, full, false); !errors.Is(err, errkind.Conflict) {
		t.Errorf("Snapshot into a snapshot dir = %v, want a conflict", err)
	}
	dmd, err := v.Snapshot(ctx, diff, true)
	if err != nil {
		t.Fatalf("diff Snapshot: %v", err)
	}
	if dmd.Type != "Diff" || dmd.Loadable {
		t.Errorf("second snapshot, a diff: type %s loadable %v, want Diff, not loadable", dmd.Type, dmd.Loadable)
	}
	var hs handleState
	if err := json.Unmarshal(v.Handle().State, &hs); err != nil || hs.Snapshots != 2 {
		t.Errorf("handle after two snapshots: %+v, %v; want snapshots 2", hs, err)
	}
	stopVM(t, v)

	fc.ResetRequests(t)
	restored := spec
	restored.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	restored.Kernel, restored.Initrd, restored.Cmdline, restored.VCPUs, restored.MemoryMiB = "", "", "", 0, 0
	restored.NIC = &vmm.NIC{TapName: "tap7"}
	got, err := d.Restore(ctx, full, restored)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	rv := got.(*VM)
	defer stopVM(t, rv)
	wantReqs := []fcapitest.Request{
		{Method: "GET", Path: "/version"},
		{Method: "PUT", Path: "/logger", Body: `{"log_path":"vmm.fifo","level":"Info","show_level":true}`},
		{Method: "PUT", Path: "/snapshot/load", Body: `{"snapshot_path":"` + full + `/vmstate","mem_backend":{"backend_type":"File","backend_path":"` + full + `/memory"},"resume_vm":true,"network_overrides":[{"iface_id":"eth0","host_dev_name":"tap7"}]}`},
	}
	if diff := cmp.Diff(wantReqs, fc.Requests(t)); diff != "" {
		t.Errorf("restore requests (-want +got):\n%s", diff)
	}
	if info, err := rv.API().Instance(ctx); err != nil || info.State != fcapi.StateRunning {
		t.Errorf("restored vm state = %+v, %v; want Running", info, err)
	}
	h := rv.Handle()
	if h.Agent.Path != filepath.Join(restored.RunDir, "vsock.sock") || !exists(h.Agent.Path) {
		t.Errorf("restored agent endpoint %s: want the vsock socket in the new run dir", h.Agent.Path)
	}
	hs = handleState{}
	if err := json.Unmarshal(h.State, &hs); err != nil || !hs.Restored || hs.Snapshots != 0 || hs.Layout.NIC.TapName != "tap7" {
		t.Errorf("restored handle state = %+v, %v", hs, err)
	}
	// A restored guest's first diff is not loadable on its own.
	if err := rv.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	rdiff := filepath.Join(snaps, "rdiff")
	if md, err := rv.Snapshot(ctx, rdiff, true); err != nil || md.Loadable {
		t.Errorf("diff of a restored vm = %+v, %v; want not loadable", md, err)
	}
	other := restored
	other.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "other")
	if _, err := d.Restore(ctx, rdiff, other); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Restore of a later diff = %v, want a failed precondition", err)
	}
	if _, err := d.Restore(ctx, filepath.Join(snaps, "none"), other); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Restore of a missing snapshot = %v, want not found", err)
	}
}

func TestRestoreRefusesOtherVersionFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{version: "1.16.1"})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	ctx := t.Context()
	if err := v.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	dir := filepath.Join(shortTempDir(t, "fcsnap"), "s")
	if _, err := v.Snapshot(ctx, dir, false); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	stopVM(t, v)

	older := newFakeFirecracker(t, fakeOptions{version: "1.15.0"})
	d2 := newTestDriver(t, Config{Binary: older.path})
	spec.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	if _, err := d2.Restore(ctx, dir, spec); !errors.Is(err, vmm.ErrIncompatible) {
		t.Fatalf("Restore on another version = %v, want ErrIncompatible", err)
	}
	for _, r := range older.Requests(t) {
		if r.Path == "/snapshot/load" {
			t.Errorf("the snapshot was sent to the other version")
		}
	}
	for _, name := range []string{"fc.sock", "vmm.fifo", "d0"} {
		if exists(filepath.Join(spec.RunDir, name)) {
			t.Errorf("%s remains after the refused restore", name)
		}
	}
}

// TestDirtyTrackingOnOldFirecrackerFakeFirecracker: before 1.13 a load
// enables dirty tracking with enable_diff_snapshots.
func TestDirtyTrackingOnOldFirecrackerFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{version: "1.12.0"})
	d := newTestDriver(t, Config{Binary: fc.path, DirtyTracking: true})
	_, spec := testImages(t)
	spec.NIC = nil
	v := bootVM(t, d, spec)
	ctx := t.Context()
	if err := v.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	dir := filepath.Join(shortTempDir(t, "fcsnap"), "d")
	if md, err := v.Snapshot(ctx, dir, true); err != nil || !md.Loadable {
		t.Fatalf("first diff of a booted vm = %+v, %v; want loadable", md, err)
	}
	stopVM(t, v)
	fc.ResetRequests(t)
	spec.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	rv, err := d.Restore(ctx, dir, spec)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	defer stopVM(t, rv)
	reqs := fc.Requests(t)
	want := `{"snapshot_path":"` + dir + `/vmstate","mem_backend":{"backend_type":"File","backend_path":"` + dir + `/memory"},"enable_diff_snapshots":true,"resume_vm":true}`
	if got := reqs[len(reqs)-1].Body; got != want {
		t.Errorf("load body = %s, want %s", got, want)
	}
}

func TestRestoreLayout(t *testing.T) {
	base := Metadata{
		Format: 1, Driver: "firecracker", FirecrackerVersion: "1.16.1", Type: "Full", Loadable: true, HostCPU: "cpu A",
		Layout: Layout{
			VCPUs: 2, MemoryMiB: 256, Disks: []DiskLayout{{ID: "d0", Path: "d0", ReadOnly: true}, {ID: "d1", Path: "d1"}},
			NIC: &NICLayout{ID: "eth0", TapName: "tap0", MAC: "02:fc:00:00:00:01"}, Vsock: VsockLayout{GuestCID: 3, Path: "vsock.sock", Port: 1024},
		},
	}
	spec := vmm.Spec{RunDir: "/run/x", Disks: []vmm.Disk{{Path: "/a", ReadOnly: true}, {Path: "/b"}}, NIC: &vmm.NIC{TapName: "tap9"}}
	tests := []struct {
		name     string
		md       func(*Metadata)
		spec     func(*vmm.Spec)
		cpu      string
		wantKind error
	}{
		{name: "fits"},
		{name: "matching sizes", spec: func(s *vmm.Spec) { s.VCPUs, s.MemoryMiB = 2, 256 }},
		{name: "other vcpus", spec: func(s *vmm.Spec) { s.VCPUs = 4 }, wantKind: vmm.ErrIncompatible},
		{name: "other memory", spec: func(s *vmm.Spec) { s.MemoryMiB = 512 }, wantKind: vmm.ErrIncompatible},
		{name: "fewer disks", spec: func(s *vmm.Spec) { s.Disks = s.Disks[:1] }, wantKind: vmm.ErrIncompatible},
		{name: "writable root", spec: func(s *vmm.Spec) { s.Disks = []vmm.Disk{{Path: "/a"}, {Path: "/b"}} }, wantKind: vmm.ErrIncompatible},
		{name: "no nic", spec: func(s *vmm.Spec) { s.NIC = nil }, wantKind: vmm.ErrIncompatible},
		{name: "other mac", spec: func(s *vmm.Spec) { s.NIC.MAC = "02:fc:00:00:00:02" }, wantKind: vmm.ErrIncompatible},
		{name: "same mac other case", spec: func(s *vmm.Spec) { s.NIC.MAC = "02:FC:00:00:00:01" }},
		{name: "other cpu", cpu: "cpu B", wantKind: vmm.ErrIncompatible},
		{name: "other driver", md: func(m *Metadata) { m.Driver = "qemu" }, wantKind: vmm.ErrIncompatible},
		{name: "newer format", md: func(m *Metadata) { m.Format = 2 }, wantKind: vmm.ErrIncompatible},
		{name: "later diff", md: func(m *Metadata) { m.Type, m.Loadable = "Diff", false }, wantKind: errkind.FailedPrecondition},
		{name: "disk path escapes", md: func(m *Metadata) {
			m.Layout.Disks = []DiskLayout{{ID: "d0", Path: "../d0", ReadOnly: true}, {ID: "d1", Path: "d1"}}
		}, wantKind: vmm.ErrIncompatible},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			md := base
			md.Layout.Disks = append([]DiskLayout(nil), base.Layout.Disks...)
			if tt.md != nil {
				tt.md(&md)
			}
			s := spec
			nic := *spec.NIC
			s.NIC = &nic
			if tt.spec != nil {
				tt.spec(&s)
			}
			cpu := tt.cpu
			if cpu == "" {
				cpu = "cpu A"
			}
			got, err := restoreLayout(&md, s, cpu, true)
			if tt.wantKind != nil {
				if !errors.Is(err, tt.wantKind) {
					t.Errorf("restoreLayout = %v, want %v", err, tt.wantKind)
				}
				return
			}
			if err != nil {
				t.Fatalf("restoreLayout: %v", err)
			}
			want := base.Layout
			want.DirtyTracking = true
			want.NIC = &NICLayout{ID: "eth0", TapName: "tap9", MAC: "02:fc:00:00:00:01"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("restoreLayout (-want +got):\n%s", diff)
			}
		})
	}
	if base.Layout.NIC.TapName != "tap0" {
		t.Errorf("restoreLayout changed the metadata")
	}
}

func TestLoadRequest(t *testing.T) {
	nic := &NICLayout{ID: "eth0", TapName: "tap0"}
	file := &fcapi.MemBackend{BackendType: "File", BackendPath: "m"}
	tests := []struct {
		name    string
		version fcapi.Version
		dirty   bool
		tap     string
		want    fcapi.SnapshotLoad
		wantErr error
	}{
		{name: "plain", version: fcapi.Version{Major: 1, Minor: 16, Patch: 1}, tap: "tap0",
			want: fcapi.SnapshotLoad{SnapshotPath: "s", MemBackend: file, ResumeVM: true}},
		{name: "dirty 1.13", version: fcapi.Version{Major: 1, Minor: 13}, dirty: true,
			want: fcapi.SnapshotLoad{SnapshotPath: "s", MemBackend: file, ResumeVM: true, TrackDirtyPages: true}},
		{name: "dirty 1.12", version: fcapi.Version{Major: 1, Minor: 12}, dirty: true,
			want: fcapi.SnapshotLoad{SnapshotPath: "s", MemBackend: file, ResumeVM: true, EnableDiffSnapshots: true}},
		{name: "other tap 1.12", version: fcapi.Version{Major: 1, Minor: 12}, tap: "tap1",
			want: fcapi.SnapshotLoad{SnapshotPath: "s", MemBackend: file, ResumeVM: true, NetworkOverrides: []fcapi.NetworkOverride{{IfaceID: "eth0", HostDevName: "tap1"}}}},
		{name: "other tap 1.11", version: fcapi.Version{Major: 1, Minor: 11}, tap: "tap1", wantErr: vmm.ErrIncompatible},
		{name: "1.0", version: fcapi.Version{Major: 1}, wantErr: vmm.ErrIncompatible},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := loadRequest(tt.version, "s", "m", tt.dirty, nic, tt.tap)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("loadRequest = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadRequest: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("loadRequest (-want +got):\n%s", diff)
			}
		})
	}
}
