package jail_test

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"space/internal/errkind"
	"space/internal/jail"
	"space/internal/testenv"
)

// system is what a shell needs in the root.
var system = []string{"/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache"}

// jailed runs a bash script in a jail and returns its output.
func jailed(t *testing.T, cfg jail.Config, script string) (string, error) {
	t.Helper()
	cmd, err := jail.Command(cfg, "/usr/bin/bash", "-c", script)
	if err != nil {
		t.Fatalf("Command() = %v", err)
	}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin"}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestJail(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "bash", "bash")
	// Something the host can reach and the jail must not: a listener on
	// the host's loopback, and a file next to the jail's mountpoint.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer l.Close()
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
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	mp := filepath.Join(dir, "root")
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg := jail.Config{UID: 2000000000, GID: 2000000001, Mountpoint: mp, ReadOnly: system, Devices: []string{"/dev/null"}}

	probe := "(exec 3<>/dev/tcp/127.0.0.1/" + port + " && echo reached) 2>&1 | tail -n 1"
	if out, err := exec.Command("bash", "-c", probe).CombinedOutput(); err != nil || !strings.Contains(string(out), "reached") {
		t.Fatalf("setup: the host cannot reach its own listener: %s, %v", out, err)
	}
	tests := []struct {
		name, script, want string
	}{
		{"ids", "echo $(id -u) $(id -g) $(id -G)", "2000000000 2000000001 2000000001"},
		{"status", "grep -E '^(NoNewPrivs|CapEff|CapBnd|CapPrm):' /proc/self/status | tr -s '\\t' ' '", "CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nNoNewPrivs: 1"},
		{"pid namespace", "echo $$; n=$(ls -d /proc/[0-9]* | wc -l); [ \"$n\" -le 5 ] && echo few", "1\nfew"}, // bash (pid 1), its subshell, ls and wc: a handful, never the host's
		{"root", "ls -A /", "bin\ndev\netc\nlib\nlib64\nproc\nusr"},
		{"dev", "ls /dev; echo x > /dev/null && echo written", "null\nwritten"},
		{"read-only", "touch /usr/x /x 2>&1 | sed 's/.*: //'", "Read-only file system\nRead-only file system"},
		{"host file", "test -e " + secret + " || echo hidden", "hidden"},
		{"loopback", probe + " | sed 's/.*: //'", "Network is unreachable"},
		{"interfaces", "ls /proc/self/net/dev >/dev/null; tail -n +3 /proc/self/net/dev | cut -d: -f1 | tr -d ' '", "lo"},
		{"hostname", "hostname; test -e /proc/sys || echo no /proc/sys", "jail\nno /proc/sys"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := jailed(t, cfg, tt.script)
			if err != nil {
				t.Fatalf("jailed %q: %v: %s", tt.script, err, got)
			}
			if got != tt.want {
				t.Errorf("jailed %q = %q, want %q", tt.script, got, tt.want)
			}
		})
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(mounts), mp) {
		t.Errorf("host mounts after the jail ran mention %s (read: %v)", mp, err)
	}
}

// TestJailBinds: a writable bind is the one place the program writes, and
// what it writes lands on the host; a read-only bind stays read-only; a
// devpts of its own gives it pseudo-terminals.
func TestJailBinds(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "bash", "bash")
	dir := t.TempDir()
	rw, ro := filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	low, up, work := filepath.Join(dir, "low"), filepath.Join(dir, "up"), filepath.Join(dir, "work")
	for _, d := range []string{rw, ro, low, up, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	for _, d := range []string{rw, up} {
		if err := os.Chown(d, 2000000000, 2000000000); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "f"), []byte("from host\n"), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	mp := filepath.Join(dir, "root")
	if err := os.Mkdir(mp, 0o700); err != nil {
		t.Fatalf("setup: %v", err)
	}
	cfg := jail.Config{UID: 2000000000, GID: 2000000000, Mountpoint: mp, ReadOnly: system, Devices: []string{"/dev/null"},
		Binds: []jail.Bind{{Source: rw, Target: "/work", Writable: true}, {Source: ro, Target: "/data/ro"}}, PTYs: true,
		Overlays: []jail.Overlay{{Lower: low, Upper: up, Work: work}}}
	script := "echo guest > /work/out && cat /data/ro/f && (touch /data/ro/x 2>&1 | sed 's/.*: //'); echo up > " + low + "/new; " +
		"test -c /dev/pts/ptmx && readlink /dev/ptmx && ls /dev/pts"
	got, err := jailed(t, cfg, script)
	if err != nil {
		t.Fatalf("jailed %q: %v: %s", script, err, got)
	}
	if want := "from host\nRead-only file system\npts/ptmx\nptmx"; got != want {
		t.Errorf("jailed %q = %q, want %q", script, got, want)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "out")); err != nil || string(b) != "guest\n" {
		t.Errorf("host sees %q, %v in the writable bind, want %q", b, err, "guest\n")
	}
	if _, err := os.Stat(filepath.Join(ro, "x")); err == nil {
		t.Errorf("the jail wrote through a read-only bind")
	}
	if b, err := os.ReadFile(filepath.Join(up, "new")); err != nil || string(b) != "up\n" {
		t.Errorf("overlay upper has %q, %v, want %q", b, err, "up\n")
	}
	if _, err := os.Stat(filepath.Join(low, "new")); err == nil {
		t.Errorf("the jail wrote through an overlay into its lower directory")
	}
}

func TestJailFails(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	mp := t.TempDir()
	cfg := jail.Config{UID: 2000000000, GID: 2000000000, Mountpoint: mp, ReadOnly: system, Devices: []string{"/dev/no-such-device"}}
	cmd, err := jail.Command(cfg, "/usr/bin/true")
	if err != nil {
		t.Fatalf("Command() = %v", err)
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 126 || !strings.HasPrefix(string(out), "space-jail: ") || !strings.Contains(string(out), "/dev/no-such-device") {
		t.Errorf("jail with a missing device = %q, %v, want exit status 126 and the device named", out, err)
	}
	if err := jail.Probe(t.Context(), cfg, "/usr/bin/true"); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("Probe() = %v, want FailedPrecondition", err)
	}
	cfg.Devices = nil
	if err := jail.Probe(t.Context(), cfg, "/usr/bin/true"); err != nil {
		t.Errorf("Probe() = %v, want nil", err)
	}
}

func TestCommandValidates(t *testing.T) {
	for _, cfg := range []jail.Config{
		{},
		{Mountpoint: "relative"},
		{Mountpoint: "/m", ReadOnly: []string{"/"}},
		{Mountpoint: "/m", ReadOnly: []string{"/usr/../etc"}},
		{Mountpoint: "/m", Devices: []string{"/etc/passwd"}},
		{Mountpoint: "/m", Binds: []jail.Bind{{Source: "rel", Target: "/t"}}},
		{Mountpoint: "/m", Binds: []jail.Bind{{Source: "/s", Target: "/"}}},
	} {
		if _, err := jail.Command(cfg, "/usr/bin/true"); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Command(%+v) = %v, want InvalidArgument", cfg, err)
		}
	}
}

// BenchmarkJail measures starting /usr/bin/true in a jail, against
// starting it plainly.
func BenchmarkJail(b *testing.B) {
	testenv.RequireRoot(b, testenv.TierNetns)
	cfg := jail.Config{UID: 2000000000, GID: 2000000000, Mountpoint: b.TempDir(), ReadOnly: system, Devices: []string{"/dev/null"}}
	b.Run("jailed", func(b *testing.B) {
		for b.Loop() {
			if err := jail.Probe(b.Context(), cfg, "/usr/bin/true"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/usr/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
