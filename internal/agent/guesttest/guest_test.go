package guesttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/guestvm"
)

// TestRealVM proves the guest is a VM of the asked shape, not a process, then
// runs the agent conformance suite in it.
func TestRealVM(t *testing.T) {
	vm := Boot(t, Options{VCPUs: 2, MemoryMiB: 512})
	t.Logf("boot to agent ready: %v", vm.BootTime)
	c := vm.Client

	t.Run("IsAVM", func(t *testing.T) {
		if got := strings.TrimSpace(agenttest.Output(t, c, "cat /sys/class/dmi/id/sys_vendor")); got != "QEMU" {
			t.Errorf("sys_vendor = %q, want QEMU", got)
		}
		if got := strings.TrimSpace(agenttest.Output(t, c, "nproc")); got != "2" {
			t.Errorf("nproc = %q, want 2", got)
		}
		kb, err := strconv.Atoi(strings.Fields(agenttest.Output(t, c, "grep MemTotal /proc/meminfo"))[1])
		if err != nil {
			t.Fatalf("MemTotal: %v", err)
		}
		// The kernel keeps some RAM for itself; 512 MiB shows as ~470 MiB.
		if want := 512 * 1024; kb > want || kb < want*85/100 {
			t.Errorf("MemTotal = %d kB, want within 85%%..100%% of %d kB", kb, want)
		}
		if got := strings.Fields(agenttest.Output(t, c, "ls /sys/class/net")); len(got) != 1 || got[0] != "lo" {
			t.Errorf("network interfaces = %q, want only lo", got)
		}
		if got := agenttest.Output(t, c, "findmnt -n -o FSTYPE /"); strings.TrimSpace(got) != "overlay" {
			t.Errorf("root file system = %q, want overlay", got)
		}
		// The guest's root is its own: a file the test writes there does not
		// appear on the host, and the image's os-release is Debian.
		if got := agenttest.Output(t, c, ". /etc/os-release; echo $ID"); strings.TrimSpace(got) != "debian" {
			t.Errorf("guest os-release ID = %q, want debian", got)
		}
		for _, tool := range []string{"python3", "curl", "git", "ps", "bash"} {
			agenttest.Output(t, c, "command -v "+tool)
		}
	})

	// Under TCG the driver boots guests without ASLR (qemu.Config.
	// TCGGuestASLR: a spawn costs a quarter as much); under KVM they keep it.
	t.Run("ASLROffOnlyUnderTCG", func(t *testing.T) {
		drv, err := Driver(t)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		accel, err := drv.Accel(t.Context(), Images(t).Kernel.Vmlinux)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		want := "0"
		if accel == "kvm" {
			want = "2"
		}
		if got := strings.TrimSpace(agenttest.Output(t, c, "cat /proc/sys/kernel/randomize_va_space")); got != want {
			t.Errorf("under %s randomize_va_space = %s, want %s", accel, got, want)
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		agenttest.Run(t, c, agenttest.Options{Scratch: "/root", PID1: true, PageReads: c.Ring(),
			Reconnect: func(ctx context.Context, old *client.Client) (*client.Client, error) {
				old.Close()
				nc, err := guestvm.Connect(ctx, vm.VMM)
				if err != nil {
					return nil, err
				}
				vm.Client, c = nc, nc // the later subtests use the new connection
				return nc, nil
			}})
	})

	t.Run("MemoryReclaim", func(t *testing.T) {
		// A file read fills the page cache; the reclaim frees it.
		agenttest.Output(t, c, "head -c 64M /dev/urandom > /root/cached && sync && cat /root/cached > /dev/null")
		r, err := c.ReclaimMemory(t.Context())
		if err != nil {
			t.Fatalf("ReclaimMemory = %v", err)
		}
		if freed := (r.FreeAfter - r.FreeBefore) >> 20; freed < 48 {
			t.Errorf("reclaim freed %d MiB (free %d -> %d MiB), want most of the 64 MiB file", freed, r.FreeBefore>>20, r.FreeAfter>>20)
		}
		agenttest.Output(t, c, "test $(wc -c < /root/cached) = 67108864 && rm /root/cached")
	})

	t.Run("WritableLayerHoldsChanges", func(t *testing.T) {
		agenttest.Output(t, c, "echo changed > /etc/space-test && sync")
		// The change lives in the upper layer; the template stays read-only.
		if out := agenttest.Output(t, c, "cat /etc/space-test"); out != "changed\n" {
			t.Errorf("cat = %q", out)
		}
	})

	t.Run("Reconnect", func(t *testing.T) {
		// The host goes away and comes back: the agent waits for it and
		// serves the new session; a background process keeps running.
		pid := strings.TrimSpace(agenttest.Output(t, c, "sleep 1000 >/dev/null 2>&1 & echo $!"))
		c.Close()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		nc, err := guestvm.Connect(ctx, vm.VMM)
		if err != nil {
			t.Fatalf("reconnect: %v", err)
		}
		vm.Client, c = nc, nc
		agenttest.Output(t, c, "kill -0 "+pid+" && kill "+pid)
	})

	t.Run("PostRestore", func(t *testing.T) {
		seed := bytes.Repeat([]byte{7}, 64)
		when := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
		err := c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: when.UnixNano(), Entropy: seed, Hostname: "forked-1"})
		if err != nil {
			t.Fatalf("PostRestore = %v", err)
		}
		if got := agenttest.Output(t, c, "date -u +%Y; hostname"); got != "2031\nforked-1\n" {
			t.Errorf("after post-restore: %q, want year 2031 and hostname forked-1", got)
		}
		// Put the clock back for the rest of the run.
		c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: seed})
		err = c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: 1, Entropy: []byte("short")})
		if err == nil {
			t.Errorf("PostRestore(4 bytes of entropy) = nil, want an error")
		}
		err = c.ConfigureNetwork(t.Context(), proto.NetConfig{Interfaces: []proto.Interface{{MAC: "02:00:00:00:00:01", Addresses: []string{"10.0.0.2/30"}}}})
		if err == nil || !strings.Contains(err.Error(), "no interface") {
			t.Errorf("ConfigureNetwork(no such NIC) = %v, want a not-found error", err)
		}
	})

	t.Run("PostRestoreIdentity", func(t *testing.T) {
		seed := bytes.Repeat([]byte{7}, 64)
		ids := func() string {
			return agenttest.Output(t, c, "cat /etc/machine-id /var/lib/dbus/machine-id /proc/sys/kernel/random/boot_id; stat -c %a /etc/machine-id; grep -c ' /proc/sys/kernel/random/boot_id ' /proc/self/mountinfo")
		}
		// D-Bus's own copy, a file here, is replaced too.
		agenttest.Output(t, c, "mkdir -p /var/lib/dbus && echo 0123456789abcdef0123456789abcdef > /var/lib/dbus/machine-id")
		for _, id := range []guestvm.Identity{guestvm.NewIdentity(), guestvm.NewIdentity()} {
			err := c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: seed, MachineID: id.MachineID, BootID: id.BootID})
			if err != nil {
				t.Fatalf("PostRestore = %v", err)
			}
			// One bind mount however many post-restores came before.
			if got, want := ids(), id.MachineID+"\n"+id.MachineID+"\n"+id.BootID+"\n444\n1\n"; got != want {
				t.Errorf("after post-restore: %q, want %q", got, want)
			}
			if h, err := c.Health(t.Context()); err != nil || h.BootID != id.BootID {
				t.Errorf("Health() = %+v, %v, want boot_id %s", h, err, id.BootID)
			}
		}
		before := ids()
		// Guest root cannot write the boot_id in place: it is read-only.
		agenttest.Output(t, c, "! echo 01234567-89ab-4def-8123-456789abcdef 2>/dev/null > /proc/sys/kernel/random/boot_id")
		// A malformed id changes nothing.
		err := c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: seed, MachineID: "../../etc/passwd", BootID: guestvm.NewIdentity().BootID})
		if !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("PostRestore(bad machine id) = %v, want InvalidArgument", err)
		}
		if got := ids(); got != before {
			t.Errorf("after a refused post-restore: %q, want %q as before", got, before)
		}
		// Where D-Bus's copy links to systemd's, the link stays.
		agenttest.Output(t, c, "ln -sf /etc/machine-id /var/lib/dbus/machine-id")
		id := guestvm.NewIdentity()
		if err := c.PostRestore(t.Context(), proto.PostRestore{UnixNanos: time.Now().UnixNano(), Entropy: seed, MachineID: id.MachineID}); err != nil {
			t.Fatalf("PostRestore = %v", err)
		}
		if got := agenttest.Output(t, c, "readlink /var/lib/dbus/machine-id; cat /var/lib/dbus/machine-id"); got != "/etc/machine-id\n"+id.MachineID+"\n" {
			t.Errorf("D-Bus's machine-id link: %q, want it to link to the new machine-id", got)
		}
	})

	t.Run("IdleCPU", func(t *testing.T) {
		// An idle guest must not spin: measure the VMM's CPU share.
		before, err := vm.VMM.Info()
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		start := time.Now()
		time.Sleep(5 * time.Second) // the measurement window itself
		after, _ := vm.VMM.Info()
		share := float64(after.CPUTime-before.CPUTime) / float64(time.Since(start))
		t.Logf("idle VM CPU share: %.2f%% of one core (connected host)", 100*share)
		if share > 0.5 {
			t.Errorf("idle VM used %.0f%% of a core, want it near zero", 100*share)
		}
	})

	t.Run("Shutdown", func(t *testing.T) {
		if err := c.Shutdown(t.Context(), false); err != nil {
			t.Fatalf("Shutdown = %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		select {
		case <-vm.VMM.Done():
		case <-ctx.Done():
			t.Errorf("VM still runs a minute after power-off")
		}
	})
}

// BenchmarkBoot measures a cold boot: QEMU start to the agent's first
// health reply.
func BenchmarkBoot(b *testing.B) {
	var total time.Duration
	for b.Loop() {
		vm := Boot(b, Options{VCPUs: 1, MemoryMiB: 512})
		total += vm.BootTime
		vm.Close()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "boot-s/op")
}

// BenchmarkGuest reports, for one booted VM: the round trip of exec true,
// stdout throughput and file write throughput.
func BenchmarkGuest(b *testing.B) {
	vm := Boot(b, Options{VCPUs: 1, MemoryMiB: 512})
	c := vm.Client
	b.Run("ExecTrue", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Exec(b.Context(), proto.ExecRequest{Argv: []string{"true"}}, client.IO{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Stdout", func(b *testing.B) {
		const size = 32 << 20
		b.SetBytes(size)
		for b.Loop() {
			_, err := c.Exec(b.Context(), proto.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero", size)}, client.IO{Stdout: discard{}})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FileWrite", func(b *testing.B) {
		data := make([]byte, 32<<20)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := c.WriteFile(b.Context(), proto.WriteArgs{Path: "/tmp/bench"}, bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
