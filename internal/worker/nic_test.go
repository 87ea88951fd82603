package worker

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/agent/guesttest"
	"space/internal/cgroup"
	"space/internal/egress/egresstest"
	"space/internal/testenv"
)

// TestNIC runs sandboxes behind their gateways over both NIC backends:
// QEMU's socket (frames as large as the link takes), and a tap in a
// network namespace of the sandbox's own with the gateway on the tap's
// host side (what the Firecracker driver needs; QEMU is given the tap
// here). The allowed name works from the guest, an upload too, and
// others do not; a fork from a snapshot works too, and so does a restore
// in place; a tap's namespace holds nothing but the tap; a worker
// restart reattaches the gateway; nothing is left once the sandboxes are
// gone.
func TestNIC(t *testing.T) {
	t.Run("socket", func(t *testing.T) { testNIC(t, false) })
	t.Run("tap", func(t *testing.T) { testNIC(t, true) })
}

func testNIC(t *testing.T, tapNICs bool) {
	testenv.RequireRoot(t, testenv.TierNetns)
	u := egresstest.Start(t)
	release := guesttest.AcquireAllSlots(t)
	defer release()
	img := guesttest.Images(t)
	drv, err := guesttest.Driver(t)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	cg, _ := cgroup.Detect()
	cfg := Config{ID: fmt.Sprintf("wtap%d", time.Now().UnixNano()%1e9), DataDir: t.TempDir(), Driver: drv,
		Templates: oneTemplate{img}, Cgroups: cg, TapNICs: tapNICs, EgressDial: u.Dial, EgressRoots: u.Pool,
		EgressResolve: func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{egresstest.Addr}, nil }}
	start := func() *Worker {
		w, err := New(cfg)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := w.Start(t.Context()); err != nil {
			t.Fatalf("Start = %v", err)
		}
		return w
	}
	w := start()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		all, _ := w.List(ctx) // never fails
		for _, inf := range all {
			w.Delete(ctx, inf.ID)
		}
		w.Close()
		if cg != nil {
			cg.Destroy(ctx, w.cgroupParent())
		}
		os.RemoveAll(w.cfg.RunRoot)
	}()
	ctx := t.Context()
	spec := Spec{Template: "default", VCPUs: 1, MemoryMiB: 256, DiskMiB: 1024, Network: &Network{Allow: []string{"api.test", "[" + egresstest.Addr6.String() + "]:80"}}}
	a, b := sandboxID(0), sandboxID(1)
	if _, err := w.Create(ctx, CreateRequest{ID: a, Team: "team", Spec: spec}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	// The guest trusts its sandbox's CA (the gateway terminates HTTPS).
	fetch := func(id, url string) string {
		return shell(t, w, id, "curl -sS -f --max-time 10 "+url+" 2>&1 || echo failed")
	}
	if got := fetch(a, "https://api.test/"); got != "hello api.test" {
		t.Errorf("curl https://api.test/ over a tap = %q", got)
	}
	// An upload: the guest sends full-size frames (segmentation offloads
	// would make them larger than the link; the agent turns them off).
	shell(t, w, a, "head -c 2000000 /dev/urandom > /tmp/up")
	if got := fetch(a, "--data-binary @/tmp/up https://api.test/upload"); got != "hello api.test" {
		t.Errorf("upload of 2 MB over a tap = %q", got)
	}
	if got, want := fetch(a, "-g http://["+egresstest.Addr6.String()+"]/"), "hello ["+egresstest.Addr6.String()+"]"; got != want {
		t.Errorf("curl over IPv6 = %q, want %q", got, want)
	}
	if got := fetch(a, "https://other.test/"); !strings.Contains(got, "failed") {
		t.Errorf("curl https://other.test/ over a tap = %q, want a failure", got)
	}
	// A tap NIC's namespace per sandbox; none with socket NICs.
	pinned := func(t *testing.T, want int, when string) {
		t.Helper()
		m, _ := filepath.Glob(filepath.Join(netnsDir, w.netnsPrefix()+"*"))
		if !tapNICs {
			want = 0
		}
		if len(m) != want {
			t.Errorf("network namespaces of the worker %s: %v, want %d", when, m, want)
		}
	}
	pinned(t, 1, "with a sandbox")

	if _, err := w.Snapshot(ctx, a, SnapshotRequest{SnapshotID: "snap_tap"}); err != nil {
		t.Fatalf("Snapshot = %v", err)
	}
	if _, err := w.CreateFromSnapshot(ctx, b, "team", "snap_tap", nil); err != nil {
		t.Fatalf("CreateFromSnapshot = %v", err)
	}
	if got := fetch(b, "https://api.test/"); got != "hello api.test" {
		t.Errorf("fork: curl https://api.test/ over its tap = %q", got)
	}
	pinned(t, 2, "with a fork")
	// Rolled back in place, the new VM opens the same tap.
	if _, err := w.Restore(ctx, a, "snap_tap"); err != nil {
		t.Fatalf("Restore = %v", err)
	}
	if got := fetch(a, "https://api.test/"); got != "hello api.test" {
		t.Errorf("after a restore in place: curl https://api.test/ = %q", got)
	}

	// A restart (VMs keep running) reattaches the gateways to the taps.
	w.Close()
	w = start()
	if got := fetch(a, "https://api.test/"); got != "hello api.test" {
		t.Errorf("after a worker restart: curl https://api.test/ = %q", got)
	}

	for _, id := range []string{a, b} {
		if err := w.Delete(ctx, id); err != nil {
			t.Fatalf("Delete = %v", err)
		}
	}
	pinned(t, 0, "after the deletes")
}
