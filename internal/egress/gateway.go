package egress

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"space/api"
	"space/internal/errkind"
)

// Config describes one sandbox's gateway.
type Config struct {
	// Frames is the guest NIC's backend: StreamFrames over a VMM's
	// socket, or a packet socket on a tap (OpenTap). Required; Close
	// closes it.
	Frames Frames
	// Gateway is the gateway's address on the guest's link (the guest's
	// default route and DNS server); Guest is the guest's. Required, IPv4.
	Gateway, Guest netip.Addr
	// Gateway6 and Guest6 are the same in IPv6 (a /64), for connections
	// to IPv6 addresses the policy's address rules allow; invalid = the
	// link has no IPv6, and every IPv6 frame is dropped.
	Gateway6, Guest6 netip.Addr
	// MTU is the guest link's IP MTU, which the guest must use too:
	// 0 = DefaultMTU, at most MaxMTU. A link whose frames cost per
	// frame (a VMM socket: no offloads) moves far more with a large one.
	MTU int
	// MAC is the gateway's link address; "" = 02:53:50:00:00:01.
	MAC net.HardwareAddr
	// Policy is the initial policy (the zero value allows nothing).
	Policy Policy
	// Resolve resolves a name for the gateway's own dials; nil = the
	// host's resolver (IPv4 addresses).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial opens the gateway's connections; nil = a net.Dialer with a 10
	// second timeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// CA signs the certificates the gateway shows the guest for the
	// names whose TLS it terminates (every allowed HTTPS connection
	// but those a tls=passthrough rule leaves opaque); the guest must
	// trust it. nil = TLS to names is refused unless passed through.
	CA *CA
	// UpstreamRoots verify upstream servers where the gateway speaks
	// TLS itself; nil = the host's roots.
	UpstreamRoots *x509.CertPool
	// HostAddr reports whether an address is one of the host's own (of
	// any interface, in the namespace the gateway dials from): such an
	// address is never a destination unless a rule names it exactly.
	// nil = none besides loopback (see hostOnly).
	HostAddr func(netip.Addr) bool
	// Reserved are address ranges that are never destinations unless a
	// rule names the address exactly: the links of other sandboxes.
	Reserved []netip.Prefix
	// Audit receives every decision; nil = none. It must not block.
	// Repeated events come aggregated (see Event.Count and audit.go).
	Audit func(Event)
	// AuditInterval is how long repeated events are counted before
	// their line is written; 0 = DefaultAuditInterval.
	AuditInterval time.Duration
	// WildcardNames and WildcardNamesPerMinute bound the distinct names
	// DNS answers under wildcard rules, the only names the guest chooses
	// that reach the gateway's resolver: a token bucket holding
	// WildcardNames (0 = DefaultWildcardNames), refilled at
	// WildcardNamesPerMinute (0 = DefaultWildcardNamesPerMinute). A name
	// the gateway already gave an address costs nothing; names an exact
	// rule allows are not limited. See names.go for the channel this
	// leaves.
	WildcardNames          int
	WildcardNamesPerMinute int
	// Log receives the gateway's own events; nil = discard.
	Log *slog.Logger
	// Metrics counts the gateway's decisions and traffic, with every
	// other gateway's sharing it (NewMetrics); nil = none.
	Metrics *Metrics

	// Test hooks: the synthetic range (invalid = syntheticRange) and
	// the clock of the wildcard names' bucket (nil = time.Now).
	namesRange netip.Prefix
	now        func() time.Time
}

// Event is one egress decision, as the API reports it. It never holds a
// secret's value.
type Event = api.EgressEvent

// Gateway is a sandbox's network: a netstack on the far end of its NIC.
type Gateway struct {
	cfg    Config
	log    *slog.Logger
	stack  *stack.Stack
	link   *frameLink
	cancel context.CancelFunc
	done   chan struct{}
	names  *nameTable
	agg    *aggregator     // or nil, without Config.Audit
	pings  chan struct{}   // a slot per echo request in flight (maxPings)
	ctx    context.Context // ends with Close
	http   *httpProxy

	mu sync.Mutex
	// +checklocks:mu
	policy Policy
	// +checklocks:mu
	open map[*conn]struct{} // the guest's connections being served
	// +checklocks:mu
	limiter *rate.Limiter // nil: unlimited
	closed  sync.Once
}

const nicID = 1

// New starts a gateway on cfg.Frames. Close it when the sandbox goes.
func New(cfg Config) (*Gateway, error) {
	if cfg.Frames == nil || !cfg.Gateway.Is4() || !cfg.Guest.Is4() {
		return nil, fmt.Errorf("egress: frames, gateway and guest IPv4 addresses are required: %w", errkind.InvalidArgument)
	}
	if cfg.Gateway6.IsValid() != cfg.Guest6.IsValid() || cfg.Gateway6.IsValid() && (!cfg.Gateway6.Is6() || !cfg.Guest6.Is6()) {
		return nil, fmt.Errorf("egress: IPv6 needs both the gateway's and the guest's IPv6 addresses: %w", errkind.InvalidArgument)
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < 576 || cfg.MTU > MaxMTU {
		return nil, fmt.Errorf("egress: mtu %d outside 576..%d: %w", cfg.MTU, MaxMTU, errkind.InvalidArgument)
	}
	if cfg.MAC == nil {
		cfg.MAC = net.HardwareAddr{0x02, 0x53, 0x50, 0, 0, 1}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
		}
	}
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.AuditInterval < 0 || cfg.WildcardNames < 0 || cfg.WildcardNamesPerMinute < 0 {
		return nil, fmt.Errorf("egress: negative audit interval or wildcard name limits: %w", errkind.InvalidArgument)
	}
	cfg.AuditInterval = cmp.Or(cfg.AuditInterval, DefaultAuditInterval)
	cfg.WildcardNames = cmp.Or(cfg.WildcardNames, DefaultWildcardNames)
	cfg.WildcardNamesPerMinute = cmp.Or(cfg.WildcardNamesPerMinute, DefaultWildcardNamesPerMinute)
	if !cfg.namesRange.IsValid() {
		cfg.namesRange = syntheticRange
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if cfg.HostAddr == nil {
		cfg.HostAddr = func(netip.Addr) bool { return false }
	}
	g := &Gateway{cfg: cfg, log: cfg.Log, done: make(chan struct{}), pings: make(chan struct{}, maxPings),
		names: newNameTable(cfg.namesRange, cfg.WildcardNames, cfg.WildcardNamesPerMinute, cfg.now), open: map[*conn]struct{}{}}
	if cfg.Audit != nil {
		g.agg = newAggregator(cfg.Audit, cfg.AuditInterval) // run once New succeeds
	}
	g.SetPolicy(cfg.Policy)
	protocols := []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol}
	if cfg.Gateway6.IsValid() {
		protocols = append(protocols, ipv6.NewProtocol)
	}
	g.stack = stack.New(stack.Options{
		NetworkProtocols:   protocols,
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	g.link = newFrameLink(cfg.Frames, cfg.MTU, tcpip.LinkAddress(cfg.MAC), g.admit)
	if err := g.setUpStack(); err != nil {
		g.stack.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.ctx, g.cancel = ctx, cancel
	g.http = newHTTPProxy(g)
	dns, err := g.listenDNS()
	if err != nil {
		cancel()
		g.http.shut()
		g.stack.Close()
		return nil, err
	}
	go func() {
		defer close(g.done)
		err := g.link.run(ctx)
		dns.Close()
		if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
			g.log.Warn("guest link ended", "err", err)
		}
	}()
	go g.serveDNS(dns)
	if g.agg != nil {
		go g.agg.run()
	}
	return g, nil
}

func (g *Gateway) setUpStack() error {
	s := g.stack
	if err := s.CreateNIC(nicID, ethernet.New(g.link.ep)); err != nil {
		return fmt.Errorf("egress: create nic: %s", err)
	}
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(g.cfg.Gateway.As4()).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("egress: address: %s", err)
	}
	routes := []tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}}
	if g.cfg.Gateway6.IsValid() {
		if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
			Protocol:          ipv6.ProtocolNumber,
			AddressWithPrefix: tcpip.AddrFrom16(g.cfg.Gateway6.As16()).WithPrefix(),
		}, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("egress: IPv6 address: %s", err)
		}
		routes = append(routes, tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: nicID})
	}
	// Every destination the guest sends to arrives here: the TCP
	// forwarder decides each connection; nothing is routed on.
	s.SetPromiscuousMode(nicID, true)
	s.SetSpoofing(nicID, true)
	s.SetRouteTable(routes)
	// Throughput: selective acks, and receive windows that grow with the
	// connection (the defaults keep both small).
	sack := tcpip.TCPSACKEnabled(true)
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20}
	for _, opt := range []tcpip.SettableTransportProtocolOption{&sack, &moderate, &rcv, &snd} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			return fmt.Errorf("egress: tcp option %T: %s", opt, err)
		}
	}
	fwd := tcp.NewForwarder(s, 0, 1024, g.handleTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)
	return nil
}

// admit filters frames from the guest before the stack sees them: ARP,
// TCP to anywhere (the forwarder decides), DNS and pings to the gateway
// itself. Everything else (other UDP, ICMP out, IPv6, other protocols,
// malformed frames, packets from or to addresses the stack would drop
// without a word, see martian4) is dropped and audited.
func (g *Gateway) admit(frame []byte) bool {
	if len(frame) < header.EthernetMinimumSize || len(frame) > g.link.maxFrame {
		g.drop(refusedNotRouted, "ip", "", 0, fmt.Sprintf("a frame of %d bytes (the link's are %d to %d)", len(frame), header.EthernetMinimumSize, g.link.maxFrame))
		return false
	}
	info, err := parseFrame(frame)
	if err != nil {
		g.drop(refusedNotRouted, "ip", "", 0, "a malformed IPv4 packet")
		return false
	}
	switch info.ethType {
	case header.ARPProtocolNumber:
		return true
	case header.IPv6ProtocolNumber:
		return g.admit6(frame)
	case header.IPv4ProtocolNumber:
	default:
		g.drop(refusedNotRouted, "ip", "", 0, fmt.Sprintf("ethertype %#04x is not routed", uint16(info.ethType)))
		return false
	}
	if why := g.martian4(frame, info); why != "" {
		g.drop(refusedSpecialAddress, protoName(info.proto), info.dst.String(), info.dstPort, why)
		return false
	}
	switch {
	case info.proto == header.TCPProtocolNumber:
		return true
	case info.proto == header.UDPProtocolNumber && info.dst == g.cfg.Gateway && info.dstPort == 53:
		return !g.Policy().Off
	case info.proto == header.ICMPv4ProtocolNumber && info.dst == g.cfg.Gateway:
		return true
	case info.proto == header.UDPProtocolNumber:
		g.drop(refusedNotRouted, "udp", info.dst.String(), info.dstPort, "UDP goes only to the gateway's DNS")
	case info.proto == header.ICMPv4ProtocolNumber && g.Policy().ICMP:
		req, ok := parseEcho(frame)
		if !ok {
			g.drop(refusedNotRouted, "icmp", info.dst.String(), 0, "only echo requests leave")
			break
		}
		select {
		case g.pings <- struct{}{}:
			go g.ping(req)
		default:
			g.drop(refusedTooMany, "icmp", info.dst.String(), 0, "too many pings in flight")
		}
	case info.proto == header.ICMPv4ProtocolNumber:
		g.drop(refusedNotRouted, "icmp", info.dst.String(), 0, "ICMP goes only to the gateway")
	default:
		g.drop(refusedNotRouted, "ip", info.dst.String(), 0, "protocol "+strconv.Itoa(int(info.proto))+" is not routed")
	}
	return false
}

// drop audits a dropped packet (aggregated, as every refusal), for
// a reason of class why.
func (g *Gateway) drop(why denial, proto, addr string, port uint16, reason string) {
	g.audit(Event{Proto: proto, Addr: addr, Port: port, Reason: reason}, why)
}

// audit records a decision: at once, or counted for a later line when
// it repeats (see audit.go). why classes a refusal for the metrics
// (ev.Reason says it in full); an allowed decision ignores it.
func (g *Gateway) audit(ev Event, why denial) {
	g.cfg.Metrics.decided(ev, why)
	if g.agg == nil {
		return
	}
	ev.Time = time.Now().UTC()
	g.agg.add(ev)
}

// SetPolicy replaces the policy. DNS queries, new connections and every
// further HTTP request follow it at once; open connections it refuses
// are closed (and audited as such) before it returns.
func (g *Gateway) SetPolicy(p Policy) {
	g.mu.Lock()
	g.policy = p
	g.limiter = nil
	if p.BytesPerSecond > 0 {
		burst := int(min(p.BytesPerSecond, 1<<20))
		g.limiter = rate.NewLimiter(rate.Limit(p.BytesPerSecond), max(burst, 64<<10))
	}
	g.mu.Unlock()
	if g.http != nil { // nil while New sets the first policy
		g.enforce(p)
		g.http.tr.CloseIdleConnections() // names may resolve elsewhere now
	}
}

// Policy returns the policy in force.
func (g *Gateway) Policy() Policy {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.policy
}

// Names returns the synthetic addresses the gateway gave out (those it
// has not recycled), for a fork's gateway to keep answering the parent's
// (see SetNames).
func (g *Gateway) Names() map[string]netip.Addr { return g.names.all() }

// SetNames takes over another gateway's synthetic addresses (a fork's
// guest remembers its parent's answers), where they are free. They cost
// no wildcard names: the other gateway counted them.
func (g *Gateway) SetNames(m map[string]netip.Addr) { g.names.load(m) }

// Close stops the gateway and closes the guest NIC's backend, and writes
// the audit lines still pending.
func (g *Gateway) Close() error {
	g.closed.Do(func() {
		g.cancel()
		g.cfg.Frames.Close()
		<-g.done
		g.http.shut()
		g.mu.Lock()
		open := make([]*conn, 0, len(g.open))
		for c := range g.open {
			open = append(open, c)
		}
		g.mu.Unlock()
		for _, c := range open {
			c.close("the sandbox's network closed")
		}
		g.stack.Close()
		if g.agg != nil {
			g.agg.close()
		}
	})
	return nil
}

// handleTCP decides a connection the guest opens, and serves it.
func (g *Gateway) handleTCP(req *tcp.ForwarderRequest) {
	id := req.ID()
	var dst netip.Addr
	if id.LocalAddress.Len() == 4 {
		dst = netip.AddrFrom4(id.LocalAddress.As4())
	} else {
		dst = netip.AddrFrom16(id.LocalAddress.As16())
	}
	port := id.LocalPort
	p := g.Policy()
	name, synthetic := g.names.pin(dst) // dst keeps its name while the connection is open
	if synthetic {
		defer g.names.unpin(dst)
	}
	refuse := func(why denial, reason string) {
		req.Complete(true)
		g.audit(Event{Proto: "tcp", Name: name, Addr: dst.String(), Port: port, Reason: reason}, why)
	}
	switch {
	case p.Off:
		refuse(refusedNetworkOff, "the network is off")
		return
	case synthetic && !p.allowsHostPort(name, port):
		refuse(refusedNotAllowed, "the policy does not allow "+name+" on port "+strconv.Itoa(int(port)))
		return
	case !synthetic && !p.allowsAddr(dst, port):
		refuse(refusedByIP, "the policy allows no connection to this address by IP (resolve an allowed name through the sandbox's DNS)")
		return
	case !synthetic:
		if why := g.blocked(p, dst, false); why != "" {
			refuse(refusedSpecialAddress, why)
			return
		}
	}
	c := newConn(name, dst, port)
	if !g.track(c, p) {
		refuse(refusedTooMany, "too many connections at once")
		return
	}
	defer g.untrack(c)
	var wq waiter.Queue
	ep, terr := req.CreateEndpoint(&wq)
	if terr != nil {
		req.Complete(true)
		return
	}
	req.Complete(false)
	nc := gonet.NewTCPConn(&wq, ep)
	c.onClose(nc.Close)
	gc := newGuestConn(g, c, nc)
	ev := g.serve(c, gc)
	c.close("")
	if ev.Reason == "" {
		ev = c.event()
	}
	// Refused after the policy let it open: the guest's first message
	// named something else, or the upstream, TLS or the protocol failed.
	g.audit(ev, refusedFailed)
}

// serve serves c until it ends, and returns the event that refused it
// (Reason set), or the zero Event.
func (g *Gateway) serve(c *conn, gc *guestConn) Event {
	ev := Event{Proto: "tcp", Name: c.name, Addr: c.dst.String(), Port: c.port}
	if c.name == "" {
		c.setMode(ModeAddr)
		ctx, cancel := g.dialCtx()
		defer cancel()
		network := "tcp4"
		if c.dst.Is6() {
			network = "tcp6"
		}
		up, err := g.cfg.Dial(ctx, network, netip.AddrPortFrom(c.dst, c.port).String())
		if err != nil {
			ev.Reason = "dial: " + err.Error()
			return ev
		}
		c.onClose(up.Close)
		g.relay(gc, up)
		return Event{}
	}
	ev.Addr = ""
	a := g.Policy().nameAccess(c.name, c.port)
	// A protocol whose server speaks first leaves the guest silent: a
	// rule naming the port lets the gateway find out.
	wait := 30 * time.Second
	if a.tcp {
		wait = serverFirstWait
	}
	first, err := readFirst(gc, wait)
	if err != nil {
		ev.Reason = "reading the first message: " + err.Error()
		return ev
	}
	if first == nil {
		if !a.tcp {
			ev.Reason = "the guest sent nothing for 30 s"
			return ev
		}
		return g.serveServerFirst(c, gc, ev)
	}
	return g.serveFirst(c, gc, first, a, ev)
}

// serverFirstWait is how long a guest's connection to a name a rule
// allows on that port may stay silent before the gateway asks the
// upstream whether it speaks first.
const serverFirstWait = time.Second

// serveFirst serves a connection to a name by what its first bytes
// (first) carry.
func (g *Gateway) serveFirst(c *conn, gc *guestConn, first []byte, a access, ev Event) Event {
	kind, sni, err := classify(gc, first, 30*time.Second)
	switch {
	case err != nil:
		ev.Reason = "reading the first message: " + err.Error()
		return ev
	case kind == firstTLS && sni != c.name:
		ev.Reason = fmt.Sprintf("the connection names %q but was opened to %s", sni, c.name)
		return ev
	case kind == firstTLS && a.passthrough:
		c.setMode(ModePassthrough)
		return g.serveOpaque(c, gc, ev)
	case kind == firstTLS:
		c.setMode(ModeHTTPS)
		return g.serveTLS(c, gc, ev)
	case kind == firstHTTP:
		c.setMode(ModeHTTP)
		g.serveHTTP(c, gc)
		return Event{}
	case a.tcp:
		c.setMode(ModeTCP)
		return g.serveOpaque(c, gc, ev)
	}
	ev.Reason = "neither TLS nor HTTP: other TCP to a name needs a rule naming its port (" + c.String() + ")"
	return ev
}

// serveTLS terminates the guest's TLS with a certificate of the
// sandbox's CA for the connection's name, and serves its requests.
func (g *Gateway) serveTLS(c *conn, gc *guestConn, ev Event) Event {
	if g.cfg.CA == nil {
		ev.Reason = "the gateway has no CA to terminate TLS with (only tls=passthrough rules reach names over TLS)"
		return ev
	}
	cert, err := g.cfg.CA.leaf(c.name)
	if err != nil {
		ev.Reason = "certificate: " + err.Error()
		return ev
	}
	tc := tls.Server(gc, &tls.Config{
		Certificates: []tls.Certificate{*cert}, NextProtos: []string{"h2", "http/1.1"}, MinVersion: tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		ev.Reason = "TLS from the guest: " + err.Error() +
			" (the guest must trust the sandbox's CA; a client that pins its own needs a tls=passthrough rule)"
		return ev
	}
	g.serveHTTP(c, tc)
	return Event{}
}

// serveHTTP hands the guest's connection (its TLS terminated, or plain)
// to the HTTP proxy and waits for it to end.
func (g *Gateway) serveHTTP(c *conn, nc net.Conn) {
	if g.http.serve(nc) {
		<-c.done
	}
}

// serveOpaque dials the connection's name and copies both ways.
func (g *Gateway) serveOpaque(c *conn, gc *guestConn, ev Event) Event {
	up, addr, err := g.dialConn(c)
	if err != nil {
		ev.Addr, ev.Reason = addrString(addr), err.Error()
		return ev
	}
	c.setUpstream(addr)
	c.onClose(up.Close)
	g.relay(gc, up)
	return Event{}
}

// serveServerFirst serves a connection the guest stays silent on, to a
// name a rule allows on that port: if the upstream speaks first, the
// connection is a protocol of that kind (neither HTTP nor TLS) and is
// copied; if the guest speaks first after all, its bytes decide, as for
// any other connection.
func (g *Gateway) serveServerFirst(c *conn, gc *guestConn, ev Event) Event {
	up, addr, err := g.dialConn(c)
	if err != nil {
		ev.Addr, ev.Reason = addrString(addr), err.Error()
		return ev
	}
	type read struct {
		b   []byte
		err error
	}
	fromUp, fromGuest := make(chan read, 1), make(chan read, 1)
	deadline := time.Now().Add(30 * time.Second)
	up.SetReadDeadline(deadline)
	gc.SetReadDeadline(deadline)
	go func() {
		b := make([]byte, 32<<10)
		n, err := up.Read(b)
		fromUp <- read{b[:n], err}
	}()
	go func() {
		b := make([]byte, 4096)
		n, err := gc.r.Read(b)
		fromGuest <- read{b[:n], err}
	}()
	select {
	case r := <-fromUp:
		gc.SetReadDeadline(time.Now()) // ends the guest's read
		rg := <-fromGuest
		gc.SetReadDeadline(time.Time{})
		up.SetReadDeadline(time.Time{})
		if len(r.b) == 0 {
			up.Close()
			ev.Addr, ev.Reason = addr.String(), "neither side spoke: "+errString(r.err)
			return ev
		}
		c.setMode(ModeTCP)
		c.setUpstream(addr)
		c.onClose(up.Close)
		gc.unread(rg.b)
		if _, err := gc.Write(r.b); err != nil {
			return Event{}
		}
		g.relay(gc, up)
		return Event{}
	case rg := <-fromGuest:
		up.Close() // the first bytes decide where to now
		<-fromUp
		gc.SetReadDeadline(time.Time{})
		if len(rg.b) == 0 {
			ev.Reason = "reading the first message: " + errString(rg.err)
			return ev
		}
		return g.serveFirst(c, gc, rg.b, g.Policy().nameAccess(c.name, c.port), ev)
	}
}

// dialConn dials the name c was opened to (see dialName).
func (g *Gateway) dialConn(c *conn) (net.Conn, netip.Addr, error) {
	ctx, cancel := g.dialCtx()
	defer cancel()
	return g.dialName(ctx, c.name, c.port)
}

func addrString(a netip.Addr) string {
	if a.IsValid() {
		return a.String()
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "no bytes"
	}
	return err.Error()
}

// dialName resolves name itself and dials the first of its addresses
// the policy lets it lead to. It returns the address it dialed or last
// tried, and an error that says why none was dialed.
func (g *Gateway) dialName(ctx context.Context, name string, port uint16) (net.Conn, netip.Addr, error) {
	addrs, err := g.cfg.Resolve(ctx, name)
	if err != nil || len(addrs) == 0 {
		return nil, netip.Addr{}, fmt.Errorf("resolving %s: %v", name, err)
	}
	p := g.Policy()
	var last netip.Addr
	err = fmt.Errorf("%s has no address", name)
	for _, a := range addrs {
		a = a.Unmap()
		last = a
		if why := g.blocked(p, a, true); why != "" {
			err = fmt.Errorf("%s resolves to %s: %s", name, a, why)
			continue
		}
		up, derr := g.cfg.Dial(ctx, "tcp4", netip.AddrPortFrom(a, port).String())
		if derr == nil {
			return up, a, nil
		}
		err = fmt.Errorf("dial: %w", derr)
	}
	return nil, last, err
}

// blocked says why the gateway does not dial a, or "" if it may: for an
// address a name resolved to (byName), any special one; for a connection
// by address that a rule allows, one that means a host rather than a
// network; and either way the host's own addresses and other
// sandboxes' links. A rule naming a exactly lifts all of these.
func (g *Gateway) blocked(p Policy, a netip.Addr, byName bool) string {
	if p.namesExactly(a) {
		return ""
	}
	switch {
	case byName && special(a):
		return "a loopback, private, link-local, metadata or other special address, which the policy does not name"
	case hostOnly(a):
		return "a loopback, link-local, metadata or unspecified address: only a rule naming it exactly allows it"
	}
	for _, f := range forms(a) {
		if g.cfg.HostAddr(f) {
			return "an address of the worker host itself: only a rule naming it exactly allows it"
		}
		for _, r := range g.cfg.Reserved {
			if r.Contains(f) {
				return "an address of the sandboxes' own links: only a rule naming it exactly allows it"
			}
		}
	}
	return ""
}

func (g *Gateway) currentLimiter() *rate.Limiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limiter
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// DialGuest opens a TCP connection from the gateway to port on the guest:
// the way in for a port the sandbox exposes (nothing else connects to the
// guest).
func (g *Gateway) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, g.stack, tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(g.cfg.Guest.As4()), Port: port}, ipv4.ProtocolNumber)
}
