package hostaddr

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"space/internal/testenv"
)

// TestSetFollowsChanges checks that a set knows a namespace's addresses
// and learns of added and removed ones within a second.
func TestSetFollowsChanges(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "ip", "iproute2")
	ns := fmt.Sprintf("space-hostaddr-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("setup: ip %v: %v: %s", args, err, out)
		}
	}
	exec.Command("ip", "netns", "del", ns).Run()
	ip("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	ip("-n", ns, "link", "set", "d0", "up")
	ip("-n", ns, "addr", "add", "192.0.2.7/24", "dev", "d0")

	s, err := New("/run/netns/"+ns, nil)
	if err != nil {
		t.Fatalf("New = %v", err)
	}
	for _, a := range []string{"127.0.0.1", "192.0.2.7", "::ffff:192.0.2.7"} {
		if !s.Contains(netip.MustParseAddr(a)) {
			t.Errorf("Contains(%s) = false; all: %v", a, s.All())
		}
	}
	if s.Contains(netip.MustParseAddr("192.0.2.8")) {
		t.Errorf("Contains(192.0.2.8) = true")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	added, v6 := netip.MustParseAddr("198.51.100.44"), netip.MustParseAddr("2001:db8::44")
	ip("-n", ns, "addr", "add", "198.51.100.44/32", "dev", "d0")
	ip("-n", ns, "addr", "add", "2001:db8::44/128", "dev", "d0", "nodad")
	testenv.Eventually(t, time.Second, func() bool { return s.Contains(added) && s.Contains(v6) })
	ip("-n", ns, "addr", "del", "192.0.2.7/24", "dev", "d0")
	testenv.Eventually(t, time.Second, func() bool { return !s.Contains(netip.MustParseAddr("192.0.2.7")) })
}
