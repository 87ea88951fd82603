package egress

import (
	"bytes"
	"cmp"
	"context"
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
	// CA signs the certificates the gateway shows the guest for hosts
	// it adds secrets for; nil = secrets are never added.
	CA *CA
	// UpstreamRoots verify upstream servers where the gateway speaks
	// TLS itself; nil = the host's roots.
	UpstreamRoots *x509.CertPool
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

	mu sync.Mutex
	// +checklocks:mu
	policy Policy
	// +checklocks:mu
	conns int
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
	g := &Gateway{cfg: cfg, log: cfg.Log, done: make(chan struct{}), pings: make(chan struct{}, maxPings),
		names: newNameTable(cfg.namesRange, cfg.WildcardNames, cfg.WildcardNamesPerMinute, cfg.now)}
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
	dns, err := g.listenDNS()
	if err != nil {
		cancel()
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
		g.drop("ip", "", 0, fmt.Sprintf("a frame of %d bytes (the link's are %d to %d)", len(frame), header.EthernetMinimumSize, g.link.maxFrame))
		return false
	}
	info, err := parseFrame(frame)
	if err != nil {
		g.drop("ip", "", 0, "a malformed IPv4 packet")
		return false
	}
	switch info.ethType {
	case header.ARPProtocolNumber:
		return true
	case header.IPv6ProtocolNumber:
		return g.admit6(frame)
	case header.IPv4ProtocolNumber:
	default:
		g.drop("ip", "", 0, fmt.Sprintf("ethertype %#04x is not routed", uint16(info.ethType)))
		return false
	}
	if why := g.martian4(frame, info); why != "" {
		g.drop(protoName(info.proto), info.dst.String(), info.dstPort, why)
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
		g.drop("udp", info.dst.String(), info.dstPort, "UDP goes only to the gateway's DNS")
	case info.proto == header.ICMPv4ProtocolNumber && g.Policy().ICMP:
		req, ok := parseEcho(frame)
		if !ok {
			g.drop("icmp", info.dst.String(), 0, "only echo requests leave")
			break
		}
		select {
		case g.pings <- struct{}{}:
			go g.ping(req)
		default:
			g.drop("icmp", info.dst.String(), 0, "too many pings in flight")
		}
	case info.proto == header.ICMPv4ProtocolNumber:
		g.drop("icmp", info.dst.String(), 0, "ICMP goes only to the gateway")
	default:
		g.drop("ip", info.dst.String(), 0, "protocol "+strconv.Itoa(int(info.proto))+" is not routed")
	}
	return false
}

// drop audits a dropped packet (aggregated, as every refusal).
func (g *Gateway) drop(proto, addr string, port uint16, reason string) {
	g.audit(Event{Proto: proto, Addr: addr, Port: port, Reason: reason})
}

// audit records a decision: at once, or counted for a later line when
// it repeats (see audit.go).
func (g *Gateway) audit(ev Event) {
	if g.agg == nil {
		return
	}
	ev.Time = time.Now().UTC()
	g.agg.add(ev)
}

// SetPolicy replaces the policy; new connections and DNS queries follow
// it, open connections are left alone.
func (g *Gateway) SetPolicy(p Policy) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.policy = p
	g.limiter = nil
	if p.BytesPerSecond > 0 {
		burst := int(min(p.BytesPerSecond, 1<<20))
		g.limiter = rate.NewLimiter(rate.Limit(p.BytesPerSecond), max(burst, 64<<10))
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
		g.stack.Close()
		if g.agg != nil {
			g.agg.close()
		}
	})
	return nil
}

// handleTCP decides a connection the guest opens.
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
	refuse := func(reason string) {
		req.Complete(true)
		g.audit(Event{Proto: "tcp", Name: name, Addr: dst.String(), Port: port, Reason: reason})
	}
	switch {
	case p.Off:
		refuse("the network is off")
		return
	case synthetic && !p.allowsHostPort(name, port):
		refuse("the policy does not allow " + name + " on port " + strconv.Itoa(int(port)))
		return
	case !synthetic && !p.allowsAddr(dst, port):
		refuse("the policy allows no connection to this address by IP (resolve an allowed name through the sandbox's DNS)")
		return
	case !synthetic && hostOnly(dst) && !p.namesExactly(dst):
		refuse("a loopback, link-local or metadata address: only a rule naming it exactly allows it")
		return
	}
	if !g.acquire(p) {
		refuse("too many connections at once")
		return
	}
	defer g.release()
	var wq waiter.Queue
	ep, terr := req.CreateEndpoint(&wq)
	if terr != nil {
		req.Complete(true)
		return
	}
	req.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	defer guest.Close()
	if synthetic {
		g.proxyName(guest, name, port)
		return
	}
	g.proxyAddr(guest, dst, port)
}

func (g *Gateway) acquire(p Policy) bool {
	limit := p.MaxConns
	if limit == 0 {
		limit = DefaultMaxConns
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conns >= limit {
		return false
	}
	g.conns++
	return true
}

func (g *Gateway) release() {
	g.mu.Lock()
	g.conns--
	g.mu.Unlock()
}

// proxyName serves a connection to an allowed name: the first message
// must name the same host (TLS SNI or HTTP Host); the gateway resolves
// the name itself and dials an address the name may lead to.
func (g *Gateway) proxyName(guest net.Conn, name string, port uint16) {
	ev := Event{Proto: "tcp", Name: name, Port: port}
	said, isTLS, head, err := peekName(guest, 30*time.Second)
	switch {
	case err != nil:
		ev.Reason = "reading the first message: " + err.Error()
	case said != name:
		ev.Reason = fmt.Sprintf("the connection names %q but was opened to %s", said, name)
	}
	if ev.Reason != "" {
		g.audit(ev)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	addrs, err := g.cfg.Resolve(ctx, name)
	if err != nil || len(addrs) == 0 {
		ev.Reason = fmt.Sprintf("resolving %s: %v", name, err)
		g.audit(ev)
		return
	}
	p := g.Policy()
	var up net.Conn
	for _, a := range addrs {
		a = a.Unmap()
		if special(a) && !p.namesExactly(a) {
			ev.Addr, ev.Reason = a.String(), name+" resolves to "+a.String()+", which the policy does not name"
			continue
		}
		ev.Addr, ev.Reason = a.String(), ""
		if up, err = g.cfg.Dial(ctx, "tcp4", netip.AddrPortFrom(a, port).String()); err == nil {
			break
		}
		ev.Reason = "dial: " + err.Error()
	}
	if up == nil {
		g.audit(ev)
		return
	}
	defer up.Close()
	if secrets := p.secretsFor(name); len(secrets) > 0 && isTLS && g.cfg.CA != nil {
		g.inject(guest, up, head, name, secrets, &ev)
		return
	}
	g.splice(guest, up, head, &ev)
}

// proxyAddr serves a connection to an address an address rule allows.
func (g *Gateway) proxyAddr(guest net.Conn, dst netip.Addr, port uint16) {
	ev := Event{Proto: "tcp", Addr: dst.String(), Port: port}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	network := "tcp4"
	if dst.Is6() {
		network = "tcp6"
	}
	up, err := g.cfg.Dial(ctx, network, netip.AddrPortFrom(dst, port).String())
	if err != nil {
		ev.Reason = "dial: " + err.Error()
		g.audit(ev)
		return
	}
	defer up.Close()
	g.splice(guest, up, nil, &ev)
}

// splice copies both ways until both are done, through the bandwidth
// limit, and audits the connection with its byte counts.
func (g *Gateway) splice(guest, up net.Conn, head []byte, ev *Event) {
	ev.Allowed = true
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		ev.BytesOut = g.copy(up, io.MultiReader(bytes.NewReader(head), guest))
		closeWrite(up)
	}()
	go func() {
		defer wg.Done()
		ev.BytesIn = g.copy(guest, up)
		closeWrite(guest)
	}()
	wg.Wait()
	g.audit(*ev)
}

func (g *Gateway) copy(dst io.Writer, src io.Reader) int64 {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if lim := g.currentLimiter(); lim != nil {
				lim.WaitN(context.Background(), min(k, lim.Burst()))
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n
			}
			n += int64(k)
		}
		if err != nil {
			return n
		}
	}
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
