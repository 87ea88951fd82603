package worker

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/guesttest"
	"space/internal/agent/proto"
	"space/internal/egress/egresstest"
	"space/internal/guestvm"
	"space/internal/tap"
	"space/internal/vmm"
)

// BenchmarkGatewayVM measures, in one run and from inside real VMs, a
// 64 MiB HTTP download and the time from the end of the name lookup to the
// first byte of a small request on a new connection: through a sandbox's gateway (QEMU's socket NIC), the
// same over a tap NIC (what Firecracker gets), and directly (a VM whose
// tap is in the upstream's namespace, routed by that namespace's kernel,
// no gateway). Then the same over HTTPS: through the gateway terminating
// TLS (every request decided: what every allowed HTTPS connection gets),
// through a tls=passthrough rule (decided by SNI, copied), and directly.
// Every figure is the guest's own curl's; the guest's offloads are off on
// every path (the agent turns them off).
//
//	go test -run '^$' -bench GatewayVM -benchtime 1x ./internal/worker
func BenchmarkGatewayVM(b *testing.B) {
	u := egresstest.Start(b)
	release := guesttest.AcquireAllSlots(b)
	defer release()
	ctx := b.Context()
	egressCfg := func(tapNICs bool) func(*Config) {
		return func(c *Config) {
			c.TapNICs, c.EgressDial, c.EgressRoots = tapNICs, u.Dial, u.Pool
			c.EgressResolve = func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{egresstest.Addr}, nil }
		}
	}
	spec := Spec{Template: "default", VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024, Network: &Network{Allow: []string{"api.test"}}}
	viaSocket := newVMWorkerWith(b, egressCfg(false))
	if _, err := viaSocket.Create(ctx, CreateRequest{ID: sandboxID(0), Team: "team", Spec: spec}); err != nil {
		b.Fatalf("Create = %v", err)
	}
	passSpec := spec
	passSpec.Network = &Network{Allow: []string{"api.test tls=passthrough"}}
	if _, err := viaSocket.Create(ctx, CreateRequest{ID: sandboxID(2), Team: "team", Spec: passSpec}); err != nil {
		b.Fatalf("Create = %v", err)
	}
	upCA := strings.ReplaceAll(string(u.CAPEM), "\n", `\n`)
	shell(b, viaSocket, sandboxID(2), "printf -- '"+upCA+"' > /tmp/up-ca.pem")
	viaTap := newVMWorkerWith(b, egressCfg(true))
	if _, err := viaTap.Create(ctx, CreateRequest{ID: sandboxID(1), Team: "team", Spec: spec}); err != nil {
		b.Fatalf("Create = %v", err)
	}
	direct := directVM(b, u)
	// The passthrough sandbox and the direct VM trust the upstream's CA
	// themselves, as a pinning client does.
	agenttest.Output(b, direct, "printf -- '"+upCA+"' > /tmp/up-ca.pem")

	// curl's own numbers: one download, then the median of 15 requests'
	// time to first byte.
	measure := func(run func(string) string, url string) (mbps, ttfbUS float64) {
		out := strings.Fields(run("curl -sS -o /dev/null -w '%{speed_download}' " + url + "/big"))
		if len(out) != 1 {
			b.Fatalf("download from %s: %q", url, out)
		}
		bps, _ := strconv.ParseFloat(out[0], 64)
		// From the end of the name lookup (the direct path has none) to
		// the first byte.
		var ttfb []float64
		for _, line := range strings.Split(strings.TrimSpace(run("for i in $(seq 15); do curl -sS -o /dev/null -w '%{time_namelookup} %{time_starttransfer}\\n' "+url+"/; done")), "\n") {
			var dns, first float64
			if _, err := fmt.Sscan(line, &dns, &first); err != nil {
				b.Fatalf("requests to %s: %q: %v", url, line, err)
			}
			ttfb = append(ttfb, (first-dns)*1e6)
		}
		if len(ttfb) != 15 {
			b.Fatalf("requests to %s: %v", url, ttfb)
		}
		slices.Sort(ttfb)
		return bps / 1e6, ttfb[7]
	}
	for b.Loop() {
		onDirect := func(c string) string { return agenttest.Output(b, direct, c) }
		onSocket := func(id string) func(string) string {
			return func(c string) string { return shell(b, viaSocket, id, c) }
		}
		dMB, dUS := measure(onDirect, "http://"+egresstest.Addr.String())
		sMB, sUS := measure(onSocket(sandboxID(0)), "http://api.test")
		tMB, tUS := measure(func(c string) string { return shell(b, viaTap, sandboxID(1), c) }, "http://api.test")
		hdMB, hdUS := measure(onDirect, "--cacert /tmp/up-ca.pem --resolve api.test:443:"+egresstest.Addr.String()+" https://api.test")
		// Each trusts one CA file, so that loading a bundle (slow under
		// TCG) weighs on no path.
		hlMB, hlUS := measure(onSocket(sandboxID(0)), "--cacert /etc/space/egress-ca.pem https://api.test")
		hpMB, hpUS := measure(onSocket(sandboxID(2)), "--cacert /tmp/up-ca.pem https://api.test")
		b.ReportMetric(hdMB, "https-direct-MB/s")
		b.ReportMetric(hlMB, "https-l7-MB/s")
		b.ReportMetric(hpMB, "https-passthrough-MB/s")
		b.ReportMetric(hlMB/hpMB, "l7/passthrough-throughput")
		b.ReportMetric(hlMB/hdMB, "l7/direct-throughput")
		b.ReportMetric(hdUS, "https-direct-ttfb-us")
		b.ReportMetric(hlUS, "https-l7-ttfb-us")
		b.ReportMetric(hpUS, "https-passthrough-ttfb-us")
		b.ReportMetric(hlUS-hpUS, "l7-added-us")
		b.ReportMetric(dMB, "direct-MB/s")
		b.ReportMetric(sMB, "gateway-MB/s")
		b.ReportMetric(tMB, "gateway-tap-MB/s")
		b.ReportMetric(sMB/dMB, "gateway/direct-throughput")
		b.ReportMetric(tMB/dMB, "gateway-tap/direct-throughput")
		b.ReportMetric(dUS, "direct-ttfb-us")
		b.ReportMetric(sUS, "gateway-ttfb-us")
		b.ReportMetric(tUS, "gateway-tap-ttfb-us")
		b.ReportMetric(sUS-dUS, "added-us")
		b.ReportMetric(tUS-dUS, "added-tap-us")
	}
}

// directVM boots a VM whose NIC is a tap in the upstream's namespace,
// addressed so that the namespace's kernel delivers the guest's packets
// to the upstream with no gateway between: the baseline.
func directVM(b *testing.B, u *egresstest.Upstream) *client.Client {
	b.Helper()
	ns := filepath.Base(u.Netns)
	if err := tap.Create(u.Netns, "tapd", -1); err != nil {
		b.Fatalf("tap: %v", err)
	}
	if out, err := exec.Command("ip", "-n", ns, "addr", "add", "10.78.0.1/24", "dev", "tapd").CombinedOutput(); err != nil {
		b.Fatalf("ip addr: %v: %s", err, out)
	}
	drv, err := guesttest.Driver(b)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 3*time.Minute)
	defer cancel()
	const mac = "02:fc:00:00:00:09"
	vm, err := guestvm.Boot(ctx, guestvm.Config{Images: guesttest.Images(b), Driver: drv, RunDir: b.TempDir(), DataDir: b.TempDir(),
		MemoryMiB: 512, NIC: &vmm.NIC{TapName: "tapd", Netns: u.Netns, MAC: mac}})
	if err != nil {
		b.Fatalf("boot: %v", err)
	}
	b.Cleanup(func() { vm.Close(context.Background()) })
	err = vm.Client.ConfigureNetwork(ctx, proto.NetConfig{Interfaces: []proto.Interface{{
		MAC: mac, Addresses: []string{"10.78.0.2/24"}, Gateway: "10.78.0.1", MTU: 1500,
	}}})
	if err != nil {
		b.Fatalf("ConfigureNetwork = %v", err)
	}
	if got := agenttest.Output(b, vm.Client, fmt.Sprintf("curl -sS http://%s/", egresstest.Addr)); got != "hello "+egresstest.Addr.String() {
		b.Fatalf("direct VM fetched %q", got)
	}
	return vm.Client
}
