package egress

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"space/internal/egress/egresstest"
	"space/internal/netns"
	"space/internal/tap"
	"space/internal/testenv"
)

// vnetFrames plays a VMM on a tap: each frame it reads or writes carries
// the virtio-net header the tap was opened with (10 bytes, all zero here:
// no offloads).
type vnetFrames struct{ f *os.File }

const vnetHdr = 10

func (v *vnetFrames) ReadFrame(buf []byte) (int, error) {
	b := make([]byte, vnetHdr+len(buf))
	n, err := v.f.Read(b)
	if err != nil {
		return 0, err
	}
	return copy(buf, b[vnetHdr:n]), nil
}

func (v *vnetFrames) WriteFrame(frame []byte) error {
	_, err := v.f.Write(append(make([]byte, vnetHdr), frame...))
	return err
}

func (v *vnetFrames) Close() error { return v.f.Close() }

// TestGatewayOnTap runs the gateway on the host side of a tap, as for
// Firecracker (which opens its tap by name): a guest stack on the tap's
// queue, where the VMM would be, resolves and fetches the allowed name
// through the gateway's packet socket; the namespace the tap is in holds
// no address or route; a frame larger than the link is dropped and the
// link goes on.
func TestGatewayOnTap(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns)
	u := egresstest.Start(t)
	ns := filepath.Join(t.TempDir(), "netns")
	if err := netns.Create(ns); err != nil {
		t.Fatalf("netns.Create = %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Remove(ns); err != nil {
			t.Errorf("netns.Remove = %v", err)
		}
	})
	if err := tap.Create(ns, "tap0", -1); err != nil {
		t.Fatalf("tap.Create = %v", err)
	}
	q, err := tap.Open(ns, "tap0")
	if err != nil {
		t.Fatalf("tap.Open = %v", err)
	}
	fd, err := unix.Dup(int(q.Fd())) // non-blocking, so that Close ends a read
	q.Close()
	if err != nil {
		t.Fatal(err)
	}
	unix.SetNonblock(fd, true)
	vmmSide := &vnetFrames{f: os.NewFile(uintptr(fd), "tap0")}
	frames, err := OpenTap(ns, "tap0")
	if err != nil {
		t.Fatalf("OpenTap = %v", err)
	}
	rules, _ := ParseRules([]string{"api.test"})
	ca, err := NewCA("sandbox test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Frames: frames, Gateway: gatewayIP, Guest: guestIP, Policy: Policy{Allow: rules},
		Dial: u.Dial, UpstreamRoots: u.Pool, CA: ca,
		Resolve: func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{upstreamIP}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	guest := newGuest(t, vmmSide, DefaultMTU)
	guest.trust(ca)

	api, rcode, err := guest.resolve(t, gatewayIP, "api.test")
	if err != nil || rcode != dns.RcodeSuccess || len(api) != 1 {
		t.Fatalf("resolve api.test over the tap = %v, %d, %v", api, rcode, err)
	}
	if got, err := httpsGet(guest, api[0], "api.test", "api.test", "/"); err != nil || got != "200 OK hello api.test" {
		t.Errorf("GET https://api.test/ over the tap = %q, %v", got, err)
	}
	if _, rcode, err := guest.resolve(t, gatewayIP, "other.test"); err != nil || rcode != dns.RcodeNameError {
		t.Errorf("resolve other.test over the tap = %d, %v; want NXDOMAIN", rcode, err)
	}

	// Nothing in the namespace but the tap, without addresses, and a
	// loopback that is down.
	err = netns.Do(ns, func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, ifi := range ifs {
			addrs, _ := ifi.Addrs()
			if len(addrs) > 0 || ifi.Name != "tap0" && ifi.Flags&net.FlagUp != 0 {
				t.Errorf("namespace interface %s (%v) has addresses %v", ifi.Name, ifi.Flags, addrs)
			}
		}
		if len(ifs) != 2 {
			t.Errorf("namespace interfaces: %v, want lo and tap0", ifs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// An oversize frame (what a segmentation offload would send) is
	// dropped; the next connection still works.
	big := make([]byte, 9000)
	copy(big, []byte{2, 0x53, 0x50, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00})
	if err := vmmSide.WriteFrame(big); err != nil {
		t.Fatalf("write an oversize frame: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	if got, err := httpsGet(guest, api[0], "api.test", "api.test", "/"); err != nil || got != "200 OK hello api.test" {
		t.Errorf("GET after an oversize frame = %q, %v", got, err)
	}
}
