package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"space/internal/agent/proto"
	"space/internal/egress"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/netns"
	"space/internal/tap"
	"space/internal/vmm"
)

// withNIC gives spec the default network (nothing allowed) if it has
// none, so that its sandbox gets a NIC: the device is fixed when the VM
// boots, and the policy can then change at any time. Warm templates and
// pools are of sandboxes with a NIC.
func withNIC(spec Spec) Spec {
	if spec.Network == nil {
		spec.Network = &Network{}
	}
	return spec
}

// netAddrs are a sandbox's addresses on its own link: a /30 of
// netBlocks, the gateway at .1 and the guest at .2.
type netAddrs struct {
	Block int    `json:"block"`
	MAC   string `json:"mac"`
}

// guestMAC is every guest NIC's address: each link is the sandbox's own,
// and a fork or restore keeps the MAC its snapshot's device has.
const guestMAC = "02:fc:00:00:00:02"

// netBlocks is where sandboxes' links are numbered from; each sandbox's
// link is its own (nothing routes between them), but distinct addresses
// keep logs and forks apart.
var netBlocks = netip.MustParsePrefix("10.200.0.0/16")

func (a netAddrs) gateway() netip.Addr { return blockAddr(a.Block, 1) }
func (a netAddrs) guest() netip.Addr   { return blockAddr(a.Block, 2) }

// netBlocks6 numbers sandboxes' IPv6 links: block b is the /64
// fd53:7061:6365:b::/64, the gateway at ::1 and the guest at ::2 (a
// unique local range; only the sandbox's own gateway is on the link).
var netBlocks6 = netip.MustParsePrefix("fd53:7061:6365::/48")

func (a netAddrs) gateway6() netip.Addr { return blockAddr6(a.Block, 1) }
func (a netAddrs) guest6() netip.Addr   { return blockAddr6(a.Block, 2) }

func blockAddr6(block, host int) netip.Addr {
	b := netBlocks6.Addr().As16()
	b[6], b[7] = byte(block>>8), byte(block)
	b[15] = byte(host)
	return netip.AddrFrom16(b)
}

func blockAddr(block, host int) netip.Addr {
	b := netBlocks.Addr().As4()
	n := block*4 + host
	b[2], b[3] = byte(n>>8), byte(n)
	return netip.AddrFrom4(b)
}

// allocNet gives s a link block no other sandbox of the worker has.
func (w *Worker) allocNet(s *sbx) (netAddrs, error) {
	used := map[int]bool{}
	w.mu.Lock()
	for _, o := range w.sandboxes {
		if o == s {
			continue
		}
		o.mu.Lock()
		if o.rec.Net != nil {
			used[o.rec.Net.Block] = true
		}
		o.mu.Unlock()
	}
	w.mu.Unlock()
	for b := 1; b < 1<<14; b++ {
		if !used[b] {
			return netAddrs{Block: b, MAC: guestMAC}, nil
		}
	}
	return netAddrs{}, fmt.Errorf("no free network block: %w", errkind.ResourceExhausted)
}

// nicFor returns the NIC a sandbox with network gets, giving it its
// addresses on first use; nil without network.
func (w *Worker) nicFor(s *sbx) (*vmm.NIC, error) {
	s.mu.Lock()
	net, addrs := s.rec.Spec.Network, s.rec.Net
	s.mu.Unlock()
	if net == nil {
		return nil, nil
	}
	if addrs == nil {
		a, err := w.allocNet(s)
		if err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.rec.Net = &a
		s.mu.Unlock()
		addrs = &a
	}
	if owner, ok := w.tapNICs(); ok {
		ns := w.netnsOf(s)
		if err := netns.Ensure(ns); err != nil {
			return nil, err
		}
		if err := tap.Create(ns, tapName, owner); err != nil {
			return nil, errors.Join(err, netns.Remove(ns))
		}
		return &vmm.NIC{TapName: tapName, Netns: ns, MAC: addrs.MAC}, nil
	}
	return &vmm.NIC{Socket: s.netSocket(), MAC: addrs.MAC}, nil
}

// Tap NICs: a driver that takes only taps (Firecracker opens its tap by
// name) gets one per sandbox, in a network namespace of the sandbox's own
// that holds nothing else: no address, no route, IPv6 off. The gateway
// reads and writes the tap's host side through a packet socket (see
// egress.OpenTap), so the guest still reaches nothing but its gateway.
// The namespace is pinned under netnsDir (where `ip netns` looks), named
// after the worker and the sandbox's slot, and goes with the sandbox.

// netnsDir is where sandboxes' network namespaces are pinned.
const netnsDir = "/run/netns"

// tapName is the tap in every sandbox's namespace (the same name in each:
// a snapshot's NIC names it, and a restore finds it in its own).
const tapName = "tap0"

// tapNICs reports whether sandboxes get tap NICs, and their owner.
func (w *Worker) tapNICs() (owner int, ok bool) {
	if t, ok := w.cfg.Driver.(vmm.TapNICs); ok {
		return t.TapOwner(), true
	}
	return -1, w.cfg.TapNICs
}

func (w *Worker) netnsPrefix() string { return "space-" + w.cfg.ID + "-" }

// netnsOf is the path of s's network namespace (tap NICs only).
func (w *Worker) netnsOf(s *sbx) string {
	return filepath.Join(netnsDir, w.netnsPrefix()+filepath.Base(s.runDir))
}

// linkMTU is the MTU of the link between a guest and its gateway. A
// socket NIC carries frames without offloads, one at a time, so each
// costs the guest and the gateway alike: frames as large as the link
// takes (virtio-net receives them in merged buffers) move several times
// more. A tap NIC keeps Ethernet's (what its VMM offers may not take
// more, and its frames pass the kernel).
func (w *Worker) linkMTU() int {
	if _, ok := w.tapNICs(); ok {
		return egress.DefaultMTU
	}
	return egress.MaxMTU
}

// removeNetns removes s's network namespace, with its tap, if it has one.
func (w *Worker) removeNetns(s *sbx) error {
	if _, ok := w.tapNICs(); !ok {
		return nil
	}
	return netns.Remove(w.netnsOf(s))
}

// guestFrames connects to the backend of s's NIC: its tap's host side,
// or the socket its VMM listens on.
func (w *Worker) guestFrames(ctx context.Context, s *sbx) (egress.Frames, error) {
	if _, ok := w.tapNICs(); ok {
		return egress.OpenTap(w.netnsOf(s), tapName)
	}
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "unix", s.netSocket())
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("connect the gateway: %w", err)
	}
	return egress.StreamFrames(conn), nil
}

// netSocket is where the sandbox's VMM accepts its gateway.
func (s *sbx) netSocket() string { return filepath.Join(s.runDir, "vm", "net.sock") }

// egressLog is the sandbox's audit file of egress decisions (JSON lines):
// the tail of it, after its head (see auditlog.go).
func (s *sbx) egressLog() string { return filepath.Join(s.dir, "egress.log") }

// attachGateway connects a gateway to the sandbox's NIC and gives the
// guest its addresses, once its VM runs and its agent answers. A sandbox
// without network has nothing to attach.
func (w *Worker) attachGateway(ctx context.Context, s *sbx) error {
	s.mu.Lock()
	spec, addrs, agent := s.rec.Spec.Network, s.rec.Net, s.agent
	s.mu.Unlock()
	if spec == nil || addrs == nil {
		return nil
	}
	policy, err := w.fullPolicy(s, *spec)
	if err != nil {
		return err
	}
	// Every HTTPS connection the gateway allows it terminates with the
	// sandbox's CA, which the guest trusts.
	ca, err := w.sandboxCA(s)
	if err != nil {
		return err
	}
	frames, err := w.guestFrames(ctx, s)
	if err != nil {
		return err
	}
	audit := w.auditor(s)
	mtu := w.linkMTU()
	gw, err := egress.New(egress.Config{
		Frames: frames, MTU: mtu, Gateway: addrs.gateway(), Guest: addrs.guest(), Policy: policy,
		Gateway6: addrs.gateway6(), Guest6: addrs.guest6(),
		Resolve: w.fencedResolve, Dial: w.fencedDial, Audit: audit.write, Metrics: w.metrics.egress, CA: ca, UpstreamRoots: w.cfg.EgressRoots,
		HostAddr: w.hostAddrs.Contains, Reserved: []netip.Prefix{netBlocks, netBlocks6},
		WildcardNames: w.cfg.EgressWildcardNames, WildcardNamesPerMinute: w.cfg.EgressWildcardNamesPerMinute,
		Log: w.log.With("sandbox_id", s.id()),
	})
	if err != nil {
		frames.Close()
		audit.close()
		return err
	}
	s.mu.Lock()
	old := s.gw
	s.gw = gw
	s.audit = audit
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if agent == nil {
		return nil // re-adopted: the guest keeps its addresses and CA
	}
	s.mu.Lock()
	grants := s.rec.Spec.Secrets
	s.mu.Unlock()
	if err := installCA(ctx, agent, ca, grants); err != nil {
		return err
	}
	cfg := proto.NetConfig{
		Interfaces: []proto.Interface{{MAC: addrs.MAC,
			Addresses: []string{netip.PrefixFrom(addrs.guest(), 30).String(), netip.PrefixFrom(addrs.guest6(), 64).String()},
			Gateway:   addrs.gateway().String(), Gateway6: addrs.gateway6().String(), MTU: mtu}},
		Nameservers: []string{addrs.gateway().String()},
	}
	err = agent.ConfigureNetwork(ctx, cfg)
	if err != nil && ctx.Err() == nil {
		// An agent from before IPv6 (an older snapshot's) refuses the
		// field: IPv4 only, then.
		ifc := &cfg.Interfaces[0]
		ifc.Addresses, ifc.Gateway6 = ifc.Addresses[:1], ""
		if agent.ConfigureNetwork(ctx, cfg) == nil {
			w.log.Warn("guest network configured without IPv6", "sandbox_id", s.id(), "err", err)
			return nil
		}
	}
	return err
}

// fullPolicy is the gateway's policy for network n of s: its rules and
// the granted secrets. It allows exactly what n does: a secret's hosts
// are reachable only if n's rules allow them (the control plane writes
// them into the policy it grants a secret with, where the user sees and
// may remove them), and the gateway adds a secret only to connections
// the rules allow.
func (w *Worker) fullPolicy(s *sbx, n Network) (egress.Policy, error) {
	p, err := n.Policy()
	if err != nil {
		return p, err
	}
	p.Secrets, err = w.policySecrets(s)
	return p, err
}

// closeGateway stops the sandbox's gateway, if it has one.
func (s *sbx) closeGateway() {
	s.mu.Lock()
	gw, audit := s.gw, s.audit
	s.gw, s.audit = nil, nil
	s.mu.Unlock()
	if gw != nil {
		gw.Close()
	}
	if audit != nil {
		audit.close()
	}
}

// SetNetwork replaces a running sandbox's egress policy: new connections
// and DNS queries follow it. A sandbox created without network has no NIC
// to give one. While the worker holds no lease it is ErrNoLease.
func (w *Worker) SetNetwork(ctx context.Context, id string, n Network) (Info, error) {
	if err := w.checkServing("set network of " + id); err != nil {
		return Info{}, err
	}
	if _, err := n.Policy(); err != nil {
		return Info{}, err
	}
	s, err := w.get(id)
	if err != nil {
		return Info{}, err
	}
	policy, err := w.fullPolicy(s, n)
	if err != nil {
		return Info{}, err
	}
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	has, gw := s.rec.Spec.Network != nil, s.gw
	if has {
		s.rec.Spec.Network = &n
	}
	s.mu.Unlock()
	if !has {
		return Info{}, fmt.Errorf("%s has no network interface: it was restored from a snapshot taken before every sandbox had one; a new sandbox has one: %w", id, errkind.FailedPrecondition)
	}
	if err := s.save(); err != nil {
		return Info{}, err
	}
	if gw != nil {
		gw.SetPolicy(policy)
	}
	w.log.Info("sandbox network policy set", "sandbox_id", id, "rules", len(n.Allow), "off", n.Off)
	return s.info(), nil
}

// EgressLog opens the sandbox's audit of egress decisions (JSON
// lines, oldest first: the head of the run, a line saying how many
// events were dropped after it if any were, and the tail) and names it: logID is unique to this worker's
// run of the sandbox (a restore in place keeps it; a resume or a move
// starts another), so the control plane, which archives a log when the
// sandbox leaves the worker, stores each run's once.
func (w *Worker) EgressLog(_ context.Context, id string) (logID string, rc io.ReadCloser, err error) {
	s, err := w.get(id)
	if err != nil {
		return "", nil, err
	}
	s.mu.Lock()
	logID = fmt.Sprintf("%s/%s/%s", w.cfg.ID, s.rec.slot(), strconv.FormatInt(s.rec.Created.UnixNano(), 36))
	s.mu.Unlock()
	rc, err = openAuditLog(s.egressLog())
	if err != nil {
		return "", nil, err
	}
	return logID, rc, nil
}

// handleExposed proxies an HTTP request to a port of the guest through
// its gateway: /sandboxes/{id}/ports/{port}/http/{path...} reaches
// http://guest:port/{path}. Upgrades (WebSockets) pass through. Every
// answer that comes from the guest's server carries the Space-Port
// header, so a client tells the guest's own 404 or 503 from SPACE's.
func (w *Worker) handleExposed(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		httpapi.WriteError(rw, httpapi.Invalid("port", "%.16q is not a port (1-65535)", r.PathValue("port")))
		return
	}
	s, err := w.get(id)
	if err != nil {
		httpapi.WriteError(rw, err)
		return
	}
	s.mu.Lock()
	gw := s.gw
	s.mu.Unlock()
	if gw == nil {
		httpapi.WriteError(rw, fmt.Errorf("%s has no network interface (create it with a network policy to expose ports): %w", id, errkind.FailedPrecondition))
		return
	}
	target := &url.URL{Scheme: "http", Host: "sandbox:" + strconv.Itoa(port)}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = "/" + pr.In.PathValue("path")
			pr.Out.URL.RawPath = ""
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return gw.DialGuest(ctx, uint16(port))
			},
			// One request per transport: nothing idles after it.
			DisableKeepAlives: true, ResponseHeaderTimeout: 5 * time.Minute,
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set("Space-Port", strconv.Itoa(port))
			return nil
		},
		ErrorHandler: func(rw http.ResponseWriter, _ *http.Request, err error) {
			httpapi.WriteError(rw, fmt.Errorf("port %d of %s: %v: %w", port, id, err, errkind.Unavailable))
		},
	}
	rp.ServeHTTP(rw, r)
}

// fencedDial is the gateways' dialer: the configured one (or a 10 s
// net.Dialer), refusing while the worker serves nothing (fence.go), so a
// guest whose lease ran out opens no connection, even in the moments
// before the fence pauses it, or after a stopped worker resumes.
func (w *Worker) fencedDial(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := w.checkServing("egress to " + addr); err != nil {
		return nil, err
	}
	if w.cfg.EgressDial != nil {
		return w.cfg.EgressDial(ctx, network, addr)
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	return d.DialContext(ctx, network, addr)
}

// fencedResolve is the gateways' resolver, refusing as fencedDial does.
func (w *Worker) fencedResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if err := w.checkServing("resolve " + host); err != nil {
		return nil, err
	}
	if w.cfg.EgressResolve != nil {
		return w.cfg.EgressResolve(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
}
