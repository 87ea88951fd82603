package vmmtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/guesttest"
	"space/internal/agent/proto"
	"space/internal/guestvm"
	"space/internal/netns"
	"space/internal/testenv"
	"space/internal/vmm"
)

// testNetwork gives the guest a NIC on a tap inside a network namespace of
// its own, addresses it through the agent, and fetches a page from a server
// listening only in that namespace.
func testNetwork(t *testing.T, newDriver NewDriver) {
	testenv.RequireRoot(t, testenv.TierNetns)
	testenv.RequireTool(t, testenv.TierNetns, "ip", "iproute2")
	ns := fmt.Sprintf("space-vmmtest-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("setup: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("-n", ns, "tuntap", "add", "dev", "tap0", "mode", "tap", "vnet_hdr")
	run("-n", ns, "addr", "add", "10.77.0.1/24", "dev", "tap0")
	run("-n", ns, "link", "set", "tap0", "up")
	l := listenIn(t, "/run/netns/"+ns, "10.77.0.1:8080")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello from the namespace")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	img := guesttest.Images(t)
	release := guesttest.AcquireSlot(t)
	rdir, data := dirs(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const mac = "02:fc:00:00:00:07"
	vm, err := guestvm.Boot(ctx, guestvm.Config{Images: img, Driver: newDriver(t), RunDir: rdir, DataDir: data,
		NIC: &vmm.NIC{TapName: "tap0", Netns: "/run/netns/" + ns, MAC: mac}})
	if err != nil {
		release()
		t.Fatalf("boot: %v", err)
	}
	closer(t, vm, release)
	err = vm.Client.ConfigureNetwork(ctx, proto.NetConfig{Interfaces: []proto.Interface{{
		MAC: mac, Addresses: []string{"10.77.0.2/24"}, Gateway: "10.77.0.1",
	}}})
	if err != nil {
		t.Fatalf("ConfigureNetwork = %v", err)
	}
	if got := agenttest.Output(t, vm.Client, "curl -s --max-time 20 http://10.77.0.1:8080/"); got != "hello from the namespace" {
		t.Errorf("guest fetched %q, want the namespace's page", got)
	}
}

// listenIn opens a TCP listener inside the network namespace at path; the
// socket stays in that namespace whoever serves it.
func listenIn(t *testing.T, path, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	err := netns.Do(path, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatalf("setup: listen in %s: %v", path, err)
	}
	return l
}
