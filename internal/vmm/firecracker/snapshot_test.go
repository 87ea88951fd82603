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
	"space/internal/storage"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// TestSnapshotRestoreAgainstFakeFirecracker snapshots a running VM (which
// runs on), takes a diff of a paused one, and restores a clone with its
// own copy of the writable disk into a fresh process.
func TestSnapshotRestoreAgainstFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	ctx := t.Context()
	snaps := shortTempDir(t, "fcsnap")
	full, diff := filepath.Join(snaps, "full"), filepath.Join(snaps, "diff")

	fc.ResetRequests(t)
	snap, err := v.Snapshot(ctx, full, vmm.SnapshotOptions{})
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.Dir != full || snap.Driver != "firecracker" || snap.Version != "1.16.1" || snap.Diff || snap.Took <= 0 || snap.Reflinked {
		t.Errorf("Snapshot = %+v", snap)
	}
	wantReqs := []fcapitest.Request{
		{Method: "PATCH", Path: "/vm", Body: `{"state":"Paused"}`},
		{Method: "PUT", Path: "/snapshot/create", Body: `{"snapshot_type":"Full","snapshot_path":"` + full + `/vmstate","mem_file_path":"` + full + `/memory"}`},
		{Method: "PATCH", Path: "/vm", Body: `{"state":"Resumed"}`},
	}
	if diff := cmp.Diff(wantReqs, fc.Requests(t)); diff != "" {
		t.Errorf("snapshot requests (-want +got):\n%s", diff)
	}
	md, err := ReadMetadata(full)
	if err != nil {
		t.Fatalf("ReadMetadata: %v", err)
	}
	want := &Metadata{
		Format: 1, Driver: "firecracker", FirecrackerVersion: "1.16.1", Type: "Full", Loadable: true,
		HostCPU: hostCPU(), HostKernel: hostKernel(), VMState: "vmstate", Memory: "memory",
		Disks:  []SnapshotDisk{{ReadOnly: true, Size: int64(len("rootfs.img"))}, {Size: int64(len("rw.img")), File: "disk1"}},
		Layout: v.st.Layout,
	}
	if diff := cmp.Diff(want, md, cmpopts.IgnoreFields(Metadata{}, "Created")); diff != "" {
		t.Errorf("snapshot metadata (-want +got):\n%s", diff)
	}
	for name, size := range map[string]int64{"memory": 256 << 20, "vmstate": -1, "disk1": int64(len("rw.img"))} {
		fi, err := os.Stat(filepath.Join(full, name))
		if err != nil || (size >= 0 && fi.Size() != size) || fi.Mode().Perm() != 0o600 {
			t.Errorf("snapshot %s = %v, %v; want mode 0600 (and %d bytes)", name, fi, err, size)
		}
	}
	if _, err := v.Snapshot(ctx, full, vmm.SnapshotOptions{}); !errors.Is(err, errkind.Conflict) || !exists(filepath.Join(full, "memory")) {
		t.Errorf("Snapshot into an existing dir = %v, want a conflict that leaves it alone", err)
	}

	// A paused VM stays paused; a second snapshot's diff needs its base.
	if err := v.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if s, err := v.Snapshot(ctx, diff, vmm.SnapshotOptions{Diff: true}); err != nil || !s.Diff {
		t.Fatalf("diff Snapshot = %+v, %v", s, err)
	}
	if info, err := v.API().Instance(ctx); err != nil || info.State != fcapi.StatePaused {
		t.Errorf("state after snapshotting a paused vm = %+v, %v; want Paused", info, err)
	}
	if dmd, err := ReadMetadata(diff); err != nil || dmd.Type != "Diff" || dmd.Loadable {
		t.Errorf("second snapshot, a diff = %+v, %v; want Diff, not loadable", dmd, err)
	}
	var hs handleState
	if err := json.Unmarshal(v.Handle().State, &hs); err != nil || hs.Snapshots != 2 {
		t.Errorf("handle after two snapshots: %+v, %v; want snapshots 2", hs, err)
	}
	// The source writes on after its snapshot; the clone must not see it.
	if err := os.WriteFile(spec.Disks[1].Path, []byte("written later"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	stopVM(t, v)

	fc.ResetRequests(t)
	restored := spec
	restored.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	restored.Kernel, restored.Initrd, restored.Cmdline, restored.VCPUs, restored.MemoryMiB = "", "", "", 0, 0
	restored.Disks = []vmm.Disk{spec.Disks[0], {Path: filepath.Join(shortTempDir(t, "fcdata"), "rw.img")}}
	restored.NIC = &vmm.NIC{TapName: "tap7"}
	got, err := d.Restore(ctx, full, restored)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	rv := got.(*VM)
	defer stopVM(t, rv)
	wantReqs = []fcapitest.Request{
		{Method: "GET", Path: "/version"},
		{Method: "PUT", Path: "/logger", Body: `{"log_path":"vmm.fifo","level":"Info","show_level":true}`},
		{Method: "PUT", Path: "/snapshot/load", Body: `{"snapshot_path":"` + full + `/vmstate","mem_backend":{"backend_type":"File","backend_path":"` + full + `/memory"},"resume_vm":true,"network_overrides":[{"iface_id":"eth0","host_dev_name":"tap7"}]}`},
	}
	if diff := cmp.Diff(wantReqs, fc.Requests(t)); diff != "" {
		t.Errorf("restore requests (-want +got):\n%s", diff)
	}
	if b, err := os.ReadFile(restored.Disks[1].Path); err != nil || string(b) != "rw.img" {
		t.Errorf("clone's writable disk = %q, %v; want the snapshot's copy", b, err)
	}
	if dst, err := os.Readlink(filepath.Join(restored.RunDir, "d1")); err != nil || dst != restored.Disks[1].Path {
		t.Errorf("clone's d1 = %q, %v; want a link to its own copy", dst, err)
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
	rdiff := filepath.Join(snaps, "rdiff")
	if s, err := rv.Snapshot(ctx, rdiff, vmm.SnapshotOptions{Diff: true}); err != nil || !s.Diff {
		t.Fatalf("diff of a restored vm = %+v, %v", s, err)
	}
	other := restored
	other.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "other")
	other.Disks = []vmm.Disk{spec.Disks[0], {Path: filepath.Join(shortTempDir(t, "fcdata"), "rw.img")}}
	if _, err := d.Restore(ctx, rdiff, other); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Restore of a later diff = %v, want a failed precondition", err)
	}
	if _, err := d.Restore(ctx, filepath.Join(snaps, "none"), other); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Restore of a missing snapshot = %v, want not found", err)
	}
	grown := other
	grown.Disks = []vmm.Disk{{Path: spec.Disks[1].Path, ReadOnly: true}, other.Disks[1]}
	if _, err := d.Restore(ctx, full, grown); !errors.Is(err, vmm.ErrIncompatible) {
		t.Errorf("Restore with another read-only image = %v, want ErrIncompatible", err)
	}
	if exists(other.Disks[1].Path) {
		t.Errorf("a refused restore left its disk copy behind")
	}
}

func TestRestoreRefusesOtherVersionFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{version: "1.16.1"})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	v := bootVM(t, d, spec)
	ctx := t.Context()
	dir := filepath.Join(shortTempDir(t, "fcsnap"), "s")
	if _, err := v.Snapshot(ctx, dir, vmm.SnapshotOptions{}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	stopVM(t, v)

	older := newFakeFirecracker(t, fakeOptions{version: "1.15.0"})
	d2 := newTestDriver(t, Config{Binary: older.path})
	spec.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	spec.Disks[1].Path = filepath.Join(shortTempDir(t, "fcdata"), "rw.img")
	if _, err := d2.Restore(ctx, dir, spec); !errors.Is(err, vmm.ErrIncompatible) {
		t.Fatalf("Restore on another version = %v, want ErrIncompatible", err)
	}
	for _, r := range older.Requests(t) {
		if r.Path == "/snapshot/load" {
			t.Errorf("the snapshot was sent to the other version")
		}
	}
	for _, p := range []string{"fc.sock", "vmm.fifo", "d0", "d1"} {
		if exists(filepath.Join(spec.RunDir, p)) {
			t.Errorf("%s remains after the refused restore", p)
		}
	}
	if exists(spec.Disks[1].Path) {
		t.Errorf("the refused restore left its disk copy")
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
	dir := filepath.Join(shortTempDir(t, "fcsnap"), "d")
	if _, err := v.Snapshot(ctx, dir, vmm.SnapshotOptions{Diff: true}); err != nil {
		t.Fatalf("first diff of a booted vm: %v", err)
	}
	if md, err := ReadMetadata(dir); err != nil || !md.Loadable || !md.Layout.DirtyTracking {
		t.Fatalf("first diff of a booted vm = %+v, %v; want loadable, with dirty tracking", md, err)
	}
	stopVM(t, v)
	fc.ResetRequests(t)
	spec.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	spec.Disks[1].Path = filepath.Join(shortTempDir(t, "fcdata"), "rw.img")
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

	// Without dirty tracking, 1.12 cannot diff at all.
	d2 := newTestDriver(t, Config{Binary: fc.path})
	spec.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "plain")
	v2 := bootVM(t, d2, spec)
	if _, err := v2.Snapshot(ctx, filepath.Join(shortTempDir(t, "fcsnap"), "d"), vmm.SnapshotOptions{Diff: true}); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("diff without dirty tracking on 1.12 = %v, want a failed precondition", err)
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

// TestDiffOntoBaseAgainstFakeFirecracker: with a MemoryPath, a diff is
// merged onto a copy of the previous snapshot's memory, so every snapshot
// is complete and loadable; the base link outlives the snapshot it came
// from, follows each new snapshot and a restore, and Stop removes it.
func TestDiffOntoBaseAgainstFakeFirecracker(t *testing.T) {
	fc := newFakeFirecracker(t, fakeOptions{})
	d := newTestDriver(t, Config{Binary: fc.path})
	_, spec := testImages(t)
	data := shortTempDir(t, "fcdata")
	spec.MemoryPath = filepath.Join(data, "base.memory")
	v := bootVM(t, d, spec)
	ctx := t.Context()
	snaps := shortTempDir(t, "fcsnap")
	snap := func(v *VM, name string) (*vmm.Snapshot, *Metadata) {
		t.Helper()
		dir := filepath.Join(snaps, name)
		s, err := v.Snapshot(ctx, dir, vmm.SnapshotOptions{Diff: true})
		if err != nil {
			t.Fatalf("Snapshot %s: %v", name, err)
		}
		md, err := ReadMetadata(dir)
		if err != nil {
			t.Fatalf("ReadMetadata %s: %v", name, err)
		}
		if !s.Diff || md.Type != "Diff" || !md.Loadable {
			t.Errorf("snapshot %s = %+v, metadata %+v; want a loadable diff", name, s, md)
		}
		base, err := os.Stat(spec.MemoryPath)
		mem, merr := os.Stat(filepath.Join(dir, "memory"))
		if err != nil || merr != nil || !os.SameFile(base, mem) {
			t.Errorf("after snapshot %s the base link is %v, %v; want its memory file", name, err, merr)
		}
		return s, md
	}
	memory := func(name string, off int64, n int) string {
		t.Helper()
		f, err := os.Open(filepath.Join(snaps, name, "memory"))
		if err != nil {
			t.Fatalf("open memory of %s: %v", name, err)
		}
		defer f.Close()
		b := make([]byte, n)
		f.ReadAt(b, off)
		return string(b)
	}

	// The first snapshot of a booted guest: every page it touched.
	snap(v, "s1")
	// What the guest had written at 1 MiB (the fake only writes page 0).
	mark := []byte("page written before s1")
	f, err := os.OpenFile(filepath.Join(snaps, "s1", "memory"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	f.WriteAt(mark, 1<<20)
	f.Close()
	fc.ResetRequests(t)
	s2, _ := snap(v, "s2")
	reqs := fc.Requests(t)
	if want := `{"snapshot_type":"Diff","snapshot_path":"` + snaps + `/s2/vmstate","mem_file_path":"` + snaps + `/s2/memory"}`; len(reqs) < 2 || reqs[1].Body != want {
		t.Errorf("snapshot requests %+v, want the diff written into s2/memory: %s", reqs, want)
	}
	if got := memory("s2", 1<<20, len(mark)); got != string(mark) {
		t.Errorf("s2 at 1 MiB = %q, want the base's %q", got, mark)
	}
	if got := memory("s2", 0, 17); got != "fake guest memory" {
		t.Errorf("s2 at 0 = %q, want the diff's page", got)
	}
	if fi, err := os.Stat(filepath.Join(snaps, "s2", "memory")); err != nil || fi.Size() != 256<<20 || fi.Mode().Perm() != 0o600 {
		t.Errorf("s2 memory = %v, %v; want the guest's 256 MiB, mode 0600", fi, err)
	}
	if want, _ := storage.Reflinks(snaps); s2.Reflinked != want {
		t.Errorf("s2 Reflinked = %v, want %v (the storage reflinks: %v)", s2.Reflinked, want, want)
	}
	// The base outlives its snapshot.
	if err := os.RemoveAll(filepath.Join(snaps, "s2")); err != nil {
		t.Fatal(err)
	}
	snap(v, "s3")
	if got := memory("s3", 1<<20, len(mark)); got != string(mark) {
		t.Errorf("s3 at 1 MiB = %q, want %q from s2, deleted meanwhile", got, mark)
	}
	stopVM(t, v)
	if exists(spec.MemoryPath) {
		t.Errorf("Stop left the base link %s", spec.MemoryPath)
	}

	// A restored guest's first diff merges onto the snapshot it came from.
	clone := spec
	clone.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	clone.Kernel, clone.Initrd, clone.Cmdline, clone.VCPUs, clone.MemoryMiB = "", "", "", 0, 0
	clone.Disks = []vmm.Disk{spec.Disks[0], {Path: filepath.Join(shortTempDir(t, "fcdata"), "rw.img")}}
	clone.MemoryPath = filepath.Join(shortTempDir(t, "fcdata"), "base.memory")
	got, err := d.Restore(ctx, filepath.Join(snaps, "s3"), clone)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	rv := got.(*VM)
	defer stopVM(t, rv)
	spec.MemoryPath = clone.MemoryPath // what snap checks
	snap(rv, "r1")
	if got := memory("r1", 1<<20, len(mark)); got != string(mark) {
		t.Errorf("first diff of the clone at 1 MiB = %q, want %q from s3", got, mark)
	}
}
