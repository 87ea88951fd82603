package qemu

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/jail"
	"space/internal/testenv"
	"space/internal/vmm"
)

// escapeProbe is what the jail must keep from QEMU: TCP listeners of the
// host, and paths of the host's file system.
type escapeProbe struct {
	addrs []string // host:port
	paths []string
}

// newEscapeProbe listens on every address of the host (loopback
// included) and creates a data dir holding a file, all readable by any
// user, so that only namespaces stand between them and QEMU's user.
func newEscapeProbe(t *testing.T) (p escapeProbe, dataDir string) {
	t.Helper()
	l, err := net.Listen("tcp4", ":0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, a := range ifaddrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			p.addrs = append(p.addrs, n.IP.String()+"/"+port)
		}
	}
	dataDir = t.TempDir()
	secret := filepath.Join(dataDir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	for _, dir := range []string{filepath.Dir(dataDir), dataDir} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	p.paths = []string{dataDir, secret}
	return p, dataDir
}

// escapes enters the namespaces of process pid as uid:gid, the way an
// attacker who took over QEMU would be, and returns what of p it reaches.
func (p escapeProbe) escapes(t *testing.T, pid int, u User) []string {
	t.Helper()
	var script strings.Builder
	for _, a := range p.addrs {
		script.WriteString("(exec 3<>/dev/tcp/" + a + ") 2>/dev/null && echo reached " + a + "\n")
	}
	for _, path := range p.paths {
		script.WriteString("test -e " + path + " && echo sees " + path + "\n")
	}
	script.WriteString("true\n")
	cmd := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "-m",
		"-S", strconv.FormatUint(uint64(u.UID), 10), "-G", strconv.FormatUint(uint64(u.GID), 10),
		"--", "/usr/bin/bash", "-c", script.String())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nsenter into qemu %d: %v: %s", pid, err, out)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return strings.Split(s, "\n")
	}
	return nil
}

// TestJailConfinesQEMU looks at a running jailed QEMU from its own side:
// entered into its namespaces as its user, nothing of the host is
// reachable. The same probe against an unjailed QEMU shows it would
// notice.
func TestJailConfinesQEMU(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierQEMU)
	testenv.RequireTool(t, testenv.TierQEMU, "nsenter", "util-linux")
	testenv.RequireTool(t, testenv.TierQEMU, "bash", "bash")
	probe, data := newEscapeProbe(t)
	kernel := fakeKernel(t, false)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatalf("setup: %v", err)
	}
	spec := func(name string) Spec {
		disk := filepath.Join(data, name+".img")
		if err := os.WriteFile(disk, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatalf("setup: %v", err)
		}
		// Guest RAM on the data dir, as on reflink storage: it reaches
		// QEMU as a descriptor.
		return Spec{Dir: filepath.Join(base, name), Kernel: kernel, MemoryMiB: 64,
			MemoryPath: filepath.Join(data, name+".memory"), Disks: []Disk{{Path: disk, Format: "raw"}}}
	}

	t.Run("jailed by default", func(t *testing.T) {
		d := newDriver(t, Config{})
		other := boot(t, d, spec("other"))
		v := boot(t, d, spec("vm"))
		p := probe
		p.paths = append(p.paths, other.Dir(), v.Dir(), filepath.Join(v.Dir(), qmpSocket), kernel)
		if got := p.escapes(t, v.Pid(), *d.user); len(got) != 0 {
			t.Errorf("jailed qemu reaches %v, want nothing", got)
		}
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(v.Pid()), "status"))
		if err != nil {
			t.Fatalf("read status: %v", err)
		}
		var got []string
		for _, line := range strings.Split(string(status), "\n") {
			k, val, _ := strings.Cut(line, ":")
			switch k {
			case "Uid", "Gid", "NoNewPrivs", "Seccomp", "CapEff", "CapBnd":
				got = append(got, k+" "+strings.Join(strings.Fields(val), " "))
			}
		}
		id := strconv.Itoa(DefaultUID)
		want := []string{"Uid " + strings.Repeat(id+" ", 3) + id, "Gid " + strings.Repeat(id+" ", 3) + id,
			"CapEff 0000000000000000", "CapBnd 0000000000000000", "NoNewPrivs 1", "Seccomp 2"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("/proc/%d/status (-want +got):\n%s", v.Pid(), diff)
		}
		c := v.Handle().Confinement
		wantC := &vmm.Confinement{UID: DefaultUID, GID: DefaultGID, NoNewPrivs: true, Seccomp: true, NetNS: true, MountNS: true, PIDNS: true}
		if diff := cmp.Diff(wantC, c); diff != "" {
			t.Errorf("Handle().Confinement (-want +got):\n%s", diff)
		}
		mounts, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil || strings.Contains(string(mounts), base) {
			t.Errorf("the host's mounts mention the run dirs (read: %v)", err)
		}

		// Stop leaves no namespace of the jail behind (nothing else holds
		// them: no bind mount, no other process).
		var nss []string
		for _, ns := range []string{"net", "mnt", "pid"} {
			id, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(v.Pid()), "ns", ns))
			if err != nil {
				t.Fatalf("read qemu's %s namespace: %v", ns, err)
			}
			nss = append(nss, id)
		}
		if err := v.Stop(t.Context()); err != nil {
			t.Fatalf("Stop() = %v", err)
		}
		holders, _ := filepath.Glob("/proc/[0-9]*/ns/*")
		for _, h := range holders {
			if id, err := os.Readlink(h); err == nil && slices.Contains(nss, id) {
				t.Errorf("%s is still in the stopped jail's namespace %s", h, id)
			}
		}
		if diff := cmp.Diff([]string{"qemu.log", "serial.log"}, dirNames(t, v.Dir())); diff != "" {
			t.Errorf("files left in run dir (-want +got):\n%s", diff)
		}
	})

	// A KVM guest's jail has /dev/kvm, open to QEMU's user (where the
	// host lets it: checkKVMAccess refuses the boot otherwise).
	t.Run("kvm device", func(t *testing.T) {
		if fi, err := os.Stat("/dev/kvm"); err != nil {
			testenv.Unavailable(t, testenv.TierKVM, err.Error())
		} else if fi.Mode()&os.ModeCharDevice == 0 {
			testenv.Unavailable(t, testenv.TierKVM, "/dev/kvm is not a device node")
		}
		d := newDriver(t, Config{Jail: JailRequire})
		cfg := d.jailConfig(Spec{Dir: t.TempDir(), Accel: "kvm"})
		if err := jail.Probe(t.Context(), cfg, "/usr/bin/bash", "-c", "test -c /dev/kvm"); err != nil {
			t.Errorf("a kvm guest's jail has no /dev/kvm: %v", err)
		}
		tcg := d.jailConfig(Spec{Dir: t.TempDir(), Accel: "tcg"})
		if err := jail.Probe(t.Context(), tcg, "/usr/bin/bash", "-c", "test ! -e /dev/kvm"); err != nil {
			t.Errorf("a tcg guest's jail has /dev/kvm: %v", err)
		}
		if err := checkKVMAccess(*d.user); err != nil {
			testenv.Unavailable(t, testenv.TierKVM, err.Error())
		}
		if err := jail.Probe(t.Context(), cfg, "/usr/bin/bash", "-c", "exec 3<>/dev/kvm"); err != nil {
			t.Errorf("open /dev/kvm in a kvm guest's jail: %v", err)
		}
	})

	// The control: unjailed, the same probe finds the host.
	t.Run("unjailed", func(t *testing.T) {
		d := newDriver(t, Config{Jail: JailOff})
		v := boot(t, d, spec("unjailed"))
		got := probe.escapes(t, v.Pid(), *d.user)
		if len(got) != len(probe.addrs)+len(probe.paths) {
			t.Errorf("unjailed qemu reaches %v, want all of %v", got, probe)
		}
		if c := v.Handle().Confinement; c.NetNS || c.MountNS || c.PIDNS || !strings.Contains(c.Missing, "jail") {
			t.Errorf("unjailed Handle().Confinement = %+v, want no namespaces and the jail missing", c)
		}
	})
}

// BenchmarkStartJailed measures what the jail adds to Start (until QMP
// is connected and the console attached), against an unjailed QEMU run
// as the same user: paused, so the guest costs nothing.
func BenchmarkStartJailed(b *testing.B) {
	testenv.RequireRoot(b, testenv.TierQEMU)
	testenv.RequireQEMU(b)
	kernel := fakeKernel(b, false)
	for _, mode := range []JailMode{JailRequire, JailOff} {
		name := map[JailMode]string{JailRequire: "jailed", JailOff: "unjailed"}[mode]
		b.Run(name, func(b *testing.B) {
			d, err := New(Config{Jail: mode})
			if err != nil {
				b.Fatalf("setup: %v", err)
			}
			base := b.TempDir()
			for i := 0; b.Loop(); i++ {
				v, err := d.Start(b.Context(), Spec{Dir: filepath.Join(base, strconv.Itoa(i)), Kernel: kernel, MemoryMiB: 64, Paused: true})
				if err != nil {
					b.Fatalf("Start() = %v", err)
				}
				b.StopTimer()
				if err := v.Stop(b.Context()); err != nil {
					b.Fatalf("Stop() = %v", err)
				}
				b.StartTimer()
			}
		})
	}
}

func TestCanReadWrite(t *testing.T) {
	u := User{UID: 1000, GID: 1000}
	tests := []struct {
		name          string
		mode, uid, gd uint32
		groups        []uint32
		want          bool
	}{
		{"root only", 0o600, 0, 0, nil, false},
		{"owner", 0o600, 1000, 0, nil, true},
		{"group", 0o660, 0, 1000, nil, true},
		{"supplementary group", 0o660, 0, 36, []uint32{36}, true},
		{"other group", 0o660, 0, 36, nil, false},
		{"group read only", 0o640, 0, 1000, nil, false},
		{"world", 0o666, 0, 0, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := canReadWrite(tt.mode, tt.uid, tt.gd, u, tt.groups); got != tt.want {
				t.Errorf("canReadWrite(%04o, %d, %d, %v, %v) = %v, want %v", tt.mode, tt.uid, tt.gd, u, tt.groups, got, tt.want)
			}
		})
	}
}

// TestJailUnavailable plays a host where the jail cannot be built: by
// default QEMU then runs unjailed and says so, once in the log and in
// every VM's confinement; JailRequire refuses to boot.
func TestJailUnavailable(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierQEMU)
	kernel := fakeKernel(t, false)
	var log strings.Builder
	logger := slog.New(slog.NewTextHandler(&log, nil))
	broken := func(cfg Config) *Driver {
		cfg.Log = logger
		d := newDriver(t, cfg)
		d.jailBin = "/nonexistent/bin/qemu" // not in the jail's root
		return d
	}

	d := broken(Config{})
	v := boot(t, d, Spec{Dir: filepath.Join(t.TempDir(), "vm"), Kernel: kernel, MemoryMiB: 64, Paused: true})
	c := v.Handle().Confinement
	if c.NetNS || c.MountNS || c.PIDNS || !strings.Contains(c.Missing, "jail: ") || !strings.Contains(c.Missing, "/nonexistent/bin/qemu") {
		t.Errorf("Handle().Confinement = %+v, want no namespaces and the jail missing, with why", c)
	}
	if c.UID != DefaultUID || !c.NoNewPrivs || !c.Seccomp {
		t.Errorf("Handle().Confinement = %+v, want the default user, no_new_privs and seccomp all the same", c)
	}
	if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), "qemu runs without jail") {
		t.Errorf("log = %q, want an error that qemu runs without jail", log.String())
	}

	d = broken(Config{Jail: JailRequire})
	v2, err := d.Start(t.Context(), Spec{Dir: filepath.Join(t.TempDir(), "vm"), Kernel: kernel, MemoryMiB: 64, Paused: true})
	if err == nil {
		v2.Stop(t.Context())
	}
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "jail") {
		t.Errorf("Start() with JailRequire on a host that cannot jail = %v, want a FailedPrecondition about the jail", err)
	}
}
