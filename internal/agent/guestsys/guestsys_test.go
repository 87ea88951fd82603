package guestsys

import (
	"log/slog"
	"net"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/testenv"
)

// TestConfigureNetwork addresses a veth inside a fresh network namespace of
// the test host, the way the agent addresses a guest NIC after a fork.
func TestConfigureNetwork(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	runtime.LockOSThread() // the namespace belongs to this thread only
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("setup: current netns: %v", err)
	}
	ns, err := netns.New() // also switches this thread into it
	if err != nil {
		runtime.UnlockOSThread()
		testenv.Unavailable(t, testenv.TierNetns, "cannot create a network namespace: "+err.Error())
	}
	t.Cleanup(func() {
		netns.Set(orig)
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
	mac, _ := net.ParseMAC("02:00:00:aa:bb:01")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: mac}, PeerName: "peer0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("setup: add veth: %v", err)
	}
	peer, _ := netlink.LinkByName("peer0")
	netlink.LinkSetUp(peer)

	s := New(slog.New(slog.DiscardHandler), nil)
	cfg := proto.NetConfig{Interfaces: []proto.Interface{{
		MAC: "02:00:00:aa:bb:01", Addresses: []string{"10.9.0.2/24", "10.9.1.2/24"}, Gateway: "10.9.0.1", MTU: 1400,
	}}}
	for range 2 { // applying twice gives the same result (a re-addressed fork)
		if err := s.ConfigureNetwork(t.Context(), cfg); err != nil {
			t.Fatalf("ConfigureNetwork = %v", err)
		}
	}
	// Re-address: the old addresses go, the new one stays.
	cfg.Interfaces[0].Addresses = []string{"10.9.0.3/24"}
	if err := s.ConfigureNetwork(t.Context(), cfg); err != nil {
		t.Fatalf("ConfigureNetwork(re-address) = %v", err)
	}
	link, err := netlink.LinkByName("eth0")
	if err != nil {
		t.Fatalf("LinkByName: %v", err)
	}
	if link.Attrs().MTU != 1400 || link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("eth0 mtu %d flags %v, want 1400 and up", link.Attrs().MTU, link.Attrs().Flags)
	}
	addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	if diff := cmp.Diff([]string{"10.9.0.3/24"}, got); diff != "" {
		t.Errorf("addresses differ (-want +got):\n%s", diff)
	}
	routes, _ := netlink.RouteList(link, netlink.FAMILY_V4)
	var gw string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			gw = r.Gw.String()
		}
	}
	if gw != "10.9.0.1" {
		t.Errorf("default route via %q, want 10.9.0.1 (routes %v)", gw, routes)
	}

	// IPv6: the address is usable at once (no duplicate detection), and
	// the default route goes via the IPv6 gateway.
	cfg.Interfaces[0].Addresses = []string{"10.9.0.3/24", "fd53:7061:6365:1::2/64"}
	cfg.Interfaces[0].Gateway6 = "fd53:7061:6365:1::1"
	if err := s.ConfigureNetwork(t.Context(), cfg); err != nil {
		t.Fatalf("ConfigureNetwork(IPv6) = %v", err)
	}
	addrs6, _ := netlink.AddrList(link, netlink.FAMILY_V6)
	var have6 bool
	for _, a := range addrs6 {
		if a.IPNet.String() == "fd53:7061:6365:1::2/64" {
			have6 = a.Flags&unix.IFA_F_TENTATIVE == 0
		}
	}
	if !have6 {
		t.Errorf("IPv6 addresses %v: want fd53:7061:6365:1::2/64, not tentative", addrs6)
	}
	routes6, _ := netlink.RouteList(link, netlink.FAMILY_V6)
	var gw6 string
	for _, r := range routes6 {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			gw6 = r.Gw.String()
		}
	}
	if gw6 != "fd53:7061:6365:1::1" {
		t.Errorf("IPv6 default route via %q (routes %v)", gw6, routes6)
	}

	err = s.ConfigureNetwork(t.Context(), proto.NetConfig{Interfaces: []proto.Interface{{MAC: "02:00:00:00:00:99"}}})
	if err == nil {
		t.Errorf("ConfigureNetwork(unknown mac) = nil, want an error")
	}
}
