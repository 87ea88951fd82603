package firecracker

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/firecracker/fcapi"
)

func TestJailerArgs(t *testing.T) {
	tests := []struct {
		name  string
		j     jailer
		netns string
		want  []string
	}{
		{
			name:  "minimal",
			j:     jailer{uid: 900, gid: 901, base: "/srv/jailer", cgroupVersion: 2},
			netns: "",
			want: []string{"--id", "vm-1", "--exec-file", "/usr/bin/firecracker", "--uid", "900", "--gid", "901",
				"--chroot-base-dir", "/srv/jailer", "--cgroup-version", "2", "--", "--api-sock", "fc.sock"},
		},
		{
			name:  "netns and parent cgroup",
			j:     jailer{uid: 900, gid: 901, base: "/var/jail", cgroupVersion: 1, parentCgroup: "space"},
			netns: "/var/run/netns/sb1",
			want: []string{"--id", "vm-1", "--exec-file", "/usr/bin/firecracker", "--uid", "900", "--gid", "901",
				"--chroot-base-dir", "/var/jail", "--cgroup-version", "1", "--parent-cgroup", "space",
				"--netns", "/var/run/netns/sb1", "--", "--api-sock", "fc.sock"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.j.args("/usr/bin/firecracker", "vm-1", tt.netns)); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
		})
	}
	j := jailer{base: "/srv/jailer", exeName: "firecracker-v1.16.1-x86_64"}
	if got, want := j.chroot("vm-1"), "/srv/jailer/firecracker-v1.16.1-x86_64/vm-1/root"; got != want {
		t.Errorf("chroot(vm-1) = %s, want %s", got, want)
	}
}

func TestNewJailerNamesChrootAfterResolvedBinary(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "firecracker-v1.16.1-x86_64")
	if err := os.WriteFile(real, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	link := filepath.Join(dir, "firecracker")
	if err := os.Symlink(real, link); err != nil {
		t.Fatalf("setup: %v", err)
	}
	j, err := newJailer(JailerConfig{Binary: real, UID: 10, GID: 10, CgroupVersion: 2}, link)
	if err != nil {
		t.Fatalf("newJailer: %v", err)
	}
	if j.exeName != "firecracker-v1.16.1-x86_64" || j.base != "/srv/jailer" || j.cgroupVersion != 2 {
		t.Errorf("newJailer = %+v", j)
	}
	if _, err := newJailer(JailerConfig{Binary: real, UID: 10, GID: 10, CgroupVersion: 3}, link); err == nil {
		t.Errorf("newJailer with cgroup version 3 succeeded")
	}
	j, err = newJailer(JailerConfig{Binary: real, UID: 10, GID: 10}, link)
	if err != nil || (j.cgroupVersion != 1 && j.cgroupVersion != 2) {
		t.Errorf("newJailer detecting the cgroup version = %+v, %v", j, err)
	}
}

func TestCgroupVersion(t *testing.T) {
	for _, tt := range []struct {
		fs   int64
		want int
	}{{unix.CGROUP2_SUPER_MAGIC, 2}, {unix.TMPFS_MAGIC, 1}, {unix.CGROUP_SUPER_MAGIC, 1}} {
		if got := cgroupVersion(tt.fs); got != tt.want {
			t.Errorf("cgroupVersion(%#x) = %d, want %d", tt.fs, got, tt.want)
		}
	}
}

// TestBootFilesRewritesPaths: unjailed, Firecracker gets the boot files'
// own paths and disk links in the run dir; jailed, every file is a name
// in the chroot.
func TestBootFilesRewritesPaths(t *testing.T) {
	spec := vmm.Spec{
		Kernel: "/img/vmlinux", Initrd: "/img/initrd",
		Disks: []vmm.Disk{{Path: "/img/rootfs.img", ReadOnly: true}, {Path: "/data/rw.img"}},
	}
	tests := []struct {
		name                   string
		jailed                 bool
		wantFiles              []placement
		wantKernel, wantInitrd string
	}{
		{
			name: "unjailed",
			wantFiles: []placement{
				{src: "/img/rootfs.img", name: "d0"},
				{src: "/data/rw.img", name: "d1", writable: true, linkOnly: true},
			},
			wantKernel: "/img/vmlinux", wantInitrd: "/img/initrd",
		},
		{
			name:   "jailed",
			jailed: true,
			wantFiles: []placement{
				{src: "/img/vmlinux", name: "vmlinux"},
				{src: "/img/initrd", name: "initrd"},
				{src: "/img/rootfs.img", name: "d0"},
				{src: "/data/rw.img", name: "d1", writable: true, linkOnly: true},
			},
			wantKernel: "vmlinux", wantInitrd: "initrd",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, kernel, initrd := bootFiles(spec, tt.jailed)
			if diff := cmp.Diff(tt.wantFiles, files, cmp.AllowUnexported(placement{})); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
			if kernel != tt.wantKernel || initrd != tt.wantInitrd {
				t.Errorf("kernel, initrd = %q, %q; want %q, %q", kernel, initrd, tt.wantKernel, tt.wantInitrd)
			}
		})
	}
	noInitrd := spec
	noInitrd.Initrd = ""
	files, _, initrd := bootFiles(noInitrd, true)
	if len(files) != 3 || initrd != "" {
		t.Errorf("jailed without initrd: %d files, initrd %q; want 3 and none", len(files), initrd)
	}
}

func inode(t *testing.T, path string) (ino uint64, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Ino, st.Uid, st.Gid, fi.Mode()
}

// TestJailPlace: read-only files the jail can read are shared (hard
// link, ownership untouched); others are copied and the copy is the
// jail's; writable files are linked and handed to the jail.
func TestJailPlace(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // chown to the jail's ids
	j := &jailer{uid: 4321, gid: 4322, base: "/srv/jailer"}
	src, dst := t.TempDir(), t.TempDir()
	files := []struct {
		name     string
		mode     os.FileMode
		p        placement
		wantLink bool
		wantUID  uint32
	}{
		{name: "world-readable", mode: 0o644, p: placement{}, wantLink: true, wantUID: 0},
		{name: "private", mode: 0o600, p: placement{}, wantLink: false, wantUID: 4321},
		{name: "writable", mode: 0o600, p: placement{writable: true, linkOnly: true}, wantLink: true, wantUID: 4321},
	}
	for _, f := range files {
		t.Run(f.name, func(t *testing.T) {
			s := filepath.Join(src, f.name)
			if err := os.WriteFile(s, []byte(f.name), f.mode); err != nil {
				t.Fatalf("setup: %v", err)
			}
			os.Chmod(s, f.mode)
			p := f.p
			p.src, p.name = s, f.name
			d := filepath.Join(dst, f.name)
			if err := j.place(p, d); err != nil {
				t.Fatalf("place: %v", err)
			}
			srcIno, _, _, _ := inode(t, s)
			dstIno, uid, _, _ := inode(t, d)
			if (srcIno == dstIno) != f.wantLink || uid != f.wantUID {
				t.Errorf("placed %s: linked %v uid %d; want linked %v uid %d", f.name, srcIno == dstIno, uid, f.wantLink, f.wantUID)
			}
			if b, err := os.ReadFile(d); err != nil || string(b) != f.name {
				t.Errorf("placed %s reads %q, %v", f.name, b, err)
			}
		})
	}
	// A link-only file the jail cannot read is refused, not copied.
	s := filepath.Join(src, "memory")
	if err := os.WriteFile(s, []byte("m"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := j.place(placement{src: s, name: "memory", linkOnly: true}, filepath.Join(dst, "memory")); err == nil {
		t.Errorf("placing an unreadable link-only file succeeded")
	}
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	const size = 64 << 20
	chunks := map[int64]string{0: "head", 32 << 20: "middle", size - 4: "tail"}
	for off, s := range chunks {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := copySparse(src, dst, 0o600); err != nil {
		t.Fatalf("copySparse: %v", err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatalf("read copy: %v", err)
	}
	want, _ := os.ReadFile(src)
	if len(got) != size || !bytes.Equal(got, want) {
		t.Fatalf("copy differs from the source (len %d)", len(got))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatalf("stat copy: %v", err)
	}
	if used := st.Blocks * 512; used > 8<<20 {
		t.Errorf("copy uses %d bytes on disk, want it sparse", used)
	}
	if err := copySparse(src, dst, 0o600); err == nil {
		t.Errorf("copySparse over an existing file succeeded")
	}
}

// TestJailedBootAgainstFakeJailer runs the jailed path with a fake jailer
// (it creates the chroot and execs the fake firecracker inside it, but
// neither chroots nor drops privileges): argv, placed files and their
// owners, in-chroot names in the requests, snapshot out of the jail,
// restore into another jail, and cleanup.
func TestJailedBootAgainstFakeJailer(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // chown to the jail's ids
	fc := newFakeFirecracker(t, fakeOptions{})
	jl := newFakeJailer(t)
	base := shortTempDir(t, "jail")
	d := newTestDriver(t, Config{Binary: fc.path, Jailer: &JailerConfig{Binary: jl.path, UID: 4321, GID: 4322, ChrootBaseDir: base}})
	_, spec := testImages(t)
	spec.NIC.Netns = "/var/run/netns/sb1" // the jailer joins it (the fake does not)
	v := bootVM(t, d, spec)
	id := instanceID(spec.RunDir)
	jailDir := filepath.Join(base, "firecracker", id)
	root := filepath.Join(jailDir, "root")

	wantJailer := []string{"--id", id, "--exec-file", fc.path, "--uid", "4321", "--gid", "4322", "--chroot-base-dir", base,
		"--cgroup-version", jl.cgroupVersion(t, d), "--netns", "/var/run/netns/sb1", "--", "--api-sock", "fc.sock"}
	if diff := cmp.Diff(invocation{Args: wantJailer}, jl.Invocation(t)); diff != "" {
		t.Errorf("jailer invocation (-want +got):\n%s", diff)
	}
	wantFC := []string{"--id", id, "--start-time-us", "1", "--start-time-cpu-us", "1", "--parent-cpu-time-us", "1", "--api-sock", "fc.sock"}
	// The driver leaves the namespace to the jailer (which the fake
	// ignores), so Firecracker runs in ours here.
	ourNetns, _ := os.Readlink("/proc/self/ns/net")
	if diff := cmp.Diff(invocation{Args: wantFC, Dir: root, Netns: ourNetns}, fc.Invocation(t)); diff != "" {
		t.Errorf("firecracker invocation (-want +got):\n%s", diff)
	}
	var bootSource string
	for _, r := range fc.Requests(t) {
		if r.Path == "/boot-source" {
			bootSource = r.Body
		}
	}
	if !strings.HasPrefix(bootSource, `{"kernel_image_path":"vmlinux",`) || !strings.HasSuffix(bootSource, `"initrd_path":"initrd"}`) {
		t.Errorf("boot source = %s, want names in the chroot", bootSource)
	}

	for _, f := range []struct {
		name, src string
		linked    bool
		uid       uint32
	}{
		{"vmlinux", spec.Kernel, true, 0},      // 0644: shared
		{"initrd", spec.Initrd, false, 4321},   // 0600: copied for the jail
		{"d0", spec.Disks[0].Path, true, 0},    // read-only, 0644: shared
		{"d1", spec.Disks[1].Path, true, 4321}, // writable: linked and handed over
	} {
		srcIno, _, _, _ := inode(t, f.src)
		ino, uid, _, _ := inode(t, filepath.Join(root, f.name))
		if (ino == srcIno) != f.linked || uid != f.uid {
			t.Errorf("%s in jail: linked %v uid %d; want linked %v uid %d", f.name, ino == srcIno, uid, f.linked, f.uid)
		}
	}
	if _, uid, gid, mode := inode(t, filepath.Join(root, "vmm.fifo")); uid != 4321 || gid != 4322 || mode&os.ModeNamedPipe == 0 {
		t.Errorf("log fifo: uid %d gid %d mode %v; want the jail's fifo", uid, gid, mode)
	}
	h := v.Handle()
	if h.Agent.Path != filepath.Join(root, "vsock.sock") || !exists(h.Agent.Path) {
		t.Errorf("agent endpoint %s: want the vsock socket in the chroot", h.Agent.Path)
	}

	ctx := t.Context()
	snap := filepath.Join(shortTempDir(t, "fcsnap"), "s")
	if _, err := v.Snapshot(ctx, snap, vmm.SnapshotOptions{}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	for _, name := range []string{jailVMState, jailMemory} {
		if exists(filepath.Join(root, name)) {
			t.Errorf("%s left in the jail after Snapshot", name)
		}
	}
	if _, uid, _, mode := inode(t, filepath.Join(snap, "memory")); uid != 4321 || mode.Perm() != 0o600 {
		t.Errorf("snapshot memory: uid %d mode %v; want the jail's, 0600", uid, mode)
	}
	stopVM(t, v)
	if exists(jailDir) {
		t.Errorf("jail %s remains after Stop", jailDir)
	}
	for _, p := range []string{spec.Kernel, spec.Initrd, spec.Disks[0].Path, spec.Disks[1].Path} {
		if !exists(p) {
			t.Errorf("Stop removed the caller's %s", p)
		}
	}

	fc.ResetRequests(t)
	clone := spec
	clone.RunDir = filepath.Join(shortTempDir(t, "fcrun"), "clone")
	clone.Disks = []vmm.Disk{spec.Disks[0], {Path: filepath.Join(shortTempDir(t, "fcdata"), "rw.img")}}
	rv, err := d.Restore(ctx, snap, clone)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	reqs := fc.Requests(t)
	want := `{"snapshot_path":"snapshot.vmstate","mem_backend":{"backend_type":"File","backend_path":"snapshot.memory"},"resume_vm":true}`
	if got := reqs[len(reqs)-1]; got.Path != "/snapshot/load" || got.Body != want {
		t.Errorf("load request = %+v, want body %s", got, want)
	}
	if info, err := rv.(*VM).API().Instance(ctx); err != nil || info.State != fcapi.StateRunning {
		t.Errorf("restored vm = %+v, %v; want Running", info, err)
	}
	stopVM(t, rv)
	if exists(filepath.Join(base, "firecracker", instanceID(clone.RunDir))) {
		t.Errorf("restored vm's jail remains after Stop")
	}
	if !exists(filepath.Join(snap, "memory")) {
		t.Errorf("Stop of the restored vm removed the snapshot's memory file")
	}
}

// cgroupVersion returns the --cgroup-version d passes, as a string.
func (b *fakeBinary) cgroupVersion(t *testing.T, d *Driver) string {
	t.Helper()
	return []string{"", "1", "2"}[d.jail.cgroupVersion]
}
