// Package egress is a sandbox's only way out: a userspace network stack
// (gVisor's netstack) at the far end of the guest's NIC, so that no kernel
// route or forwarding leads from the guest anywhere. It answers DNS itself
// (names the policy does not allow get NXDOMAIN and are never forwarded),
// gives each allowed name a synthetic address, and for every connection
// the guest opens decides by name where one exists: it checks the TLS SNI
// or HTTP Host against the name the guest resolved, resolves and dials
// the name itself, and refuses loopback, private, link-local and metadata
// destinations unless the policy names that exact address.
//
// The names a guest chooses under a wildcard rule reach the host's
// resolver when it connects to them, so their number is bounded (a
// token bucket: Config.WildcardNames, then Config.WildcardNamesPerMinute;
// REFUSED beyond): the channel carries at most 253 bytes per name, 7,590
// bytes a minute after a first 64,768 with the defaults (names.go).
// Synthetic addresses are recycled least recently used, never one an open
// connection pins. Every decision is audited, repeats aggregated into
// one line per destination and interval (audit.go), and frames the
// stack would drop silently are dropped and audited first (martian.go).
//
// Lock order: Gateway.mu, nameTable.mu and aggregator.mu are never held
// together, nor across a callback (Audit); nameTable.mu is held while
// its rate.Limiter takes its own.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"space/internal/errkind"
)

// Policy says where a sandbox may connect. The zero value allows nothing
// (DNS answers NXDOMAIN, every connection is refused).
type Policy struct {
	// Off takes the network away entirely: not even DNS answers.
	Off bool
	// Allow are the rules; a connection is allowed if one matches.
	Allow []Rule
	// ICMP lets echo requests (ping) through to what the rules allow on
	// every port: an allowed name (the gateway pings its address) or an
	// address an address rule covers. Other ICMP never leaves.
	ICMP bool
	// MaxConns bounds the connections open at once; 0 = DefaultMaxConns.
	MaxConns int
	// BytesPerSecond bounds the throughput of all connections together,
	// each direction; 0 = unlimited.
	BytesPerSecond int64
	// Secrets are added to requests for the hosts they are bound to
	// (see Secret); the gateway needs Config.CA for them.
	Secrets []Secret
}

// DefaultMaxConns is Policy.MaxConns when it is 0.
const DefaultMaxConns = 256

// Rule allows a host name (exact, or "*.suffix" for any name under
// suffix) or an address range, on one port or on any.
//
// A connection to a name is HTTP(S) decided request by request (see
// the package doc) unless the rule says Passthrough; TCP that is neither
// TLS nor HTTP reaches a name only through a rule naming its port.
// Connections to addresses are not inspected.
type Rule struct {
	Host   string       // lower case, no trailing dot; or ""
	Prefix netip.Prefix // when Host is ""
	Port   uint16       // 0 = any
	// Passthrough (host rules only) leaves TLS to the name opaque: the
	// connection is decided by its SNI alone and its requests are not
	// seen, so no secret is added to them. For clients that pin their
	// upstream's certificate and for protocols other than HTTP over TLS.
	Passthrough bool
}

// passthroughOption is how a rule's text says Rule.Passthrough.
const passthroughOption = "tls=passthrough"

func (r Rule) String() string {
	s := r.dest()
	if r.Passthrough {
		s += " " + passthroughOption
	}
	return s
}

// dest is the rule's destination: host or range, and port.
func (r Rule) dest() string {
	s := r.Host
	if s == "" {
		s = r.Prefix.String()
	}
	if r.Port != 0 {
		if r.Host == "" && r.Prefix.Addr().Is6() {
			s = "[" + s + "]"
		}
		s += ":" + strconv.Itoa(int(r.Port))
	}
	return s
}

// ParseRule reads "host", "host:port", "*.suffix[:port]", an IPv4 address
// or CIDR with an optional ":port" ("10.0.0.0/8:5432"), or an IPv6
// address or CIDR, in brackets when a port follows ("2001:db8::/32",
// "[2001:db8::7]:443"). IPv6 is reached only by address: names resolve to
// IPv4 (see the package doc). A host rule may end in " tls=passthrough"
// (Rule.Passthrough).
func ParseRule(s string) (Rule, error) {
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("rule %.100q: %s: %w", s, why, errkind.InvalidArgument)
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return bad("empty")
	}
	var passthrough bool
	for _, opt := range fields[1:] {
		if opt != passthroughOption {
			return bad("the only option after the destination is " + passthroughOption)
		}
		passthrough = true
	}
	r, err := parseDest(fields[0])
	if err != nil {
		return bad(err.Error())
	}
	if passthrough && r.Host == "" {
		return bad(passthroughOption + " is for host rules: connections to addresses are not inspected")
	}
	r.Passthrough = passthrough
	return r, nil
}

// parseDest reads a rule's destination; the error says what is wrong
// with it.
func parseDest(s string) (Rule, error) {
	bad := func(why string) (Rule, error) { return Rule{}, errors.New(why) }
	var r Rule
	if v6, port, ok := splitIPv6Rule(s); ok {
		if port != "" {
			p, err := strconv.ParseUint(port, 10, 16)
			if err != nil || p == 0 {
				return bad("the port after ']:' is a number from 1 to 65535")
			}
			r.Port = uint16(p)
		}
		if strings.ContainsRune(v6, '/') {
			p, err := netip.ParsePrefix(v6)
			if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() {
				return bad("not an IPv6 address range")
			}
			r.Prefix = p.Masked()
			return r, nil
		}
		a, err := netip.ParseAddr(v6)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return bad("not an IPv6 address (an IPv4 one is written as such)")
		}
		r.Prefix = netip.PrefixFrom(a, 128)
		return r, nil
	}
	rest := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return bad("the port after ':' is a number from 1 to 65535")
		}
		r.Port, rest = uint16(p), s[:i]
	}
	if strings.ContainsRune(rest, '/') {
		p, err := netip.ParsePrefix(rest)
		if err != nil || !p.Addr().Is4() {
			return bad("not an IPv4 address range")
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(rest); err == nil {
		if !a.Is4() {
			return bad("not an IPv4 address")
		}
		r.Prefix = netip.PrefixFrom(a, 32)
		return r, nil
	}
	host := strings.ToLower(strings.TrimSuffix(rest, "."))
	name := strings.TrimPrefix(host, "*.")
	if !validName(name) || strings.Contains(name, "*") {
		return bad("not a host name, *.suffix, IPv4 address or CIDR")
	}
	r.Host = host
	return r, nil
}

// splitIPv6Rule reports whether s is an IPv6 rule, and splits it into
// its address or range and its port ("" for none).
func splitIPv6Rule(s string) (addr, port string, ok bool) {
	if rest, found := strings.CutPrefix(s, "["); found {
		addr, after, closed := strings.Cut(rest, "]")
		if !closed {
			return rest, "x", true // unclosed: the port check says so
		}
		if after == "" {
			return addr, "", true
		}
		port, hasPort := strings.CutPrefix(after, ":")
		if !hasPort {
			return addr, "x", true
		}
		return addr, port, true
	}
	if strings.Count(s, ":") >= 2 { // a name or IPv4 rule has one colon at most
		return s, "", true
	}
	return "", "", false
}

// ParseRules reads rules; the error names the first bad one.
func ParseRules(ss []string) ([]Rule, error) {
	out := make([]Rule, 0, len(ss))
	for _, s := range ss {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// validName reports whether s is a DNS name of letter-digit-hyphen labels
// (underscores allowed, as some service names have them).
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// hostMatches reports whether the rule's host pattern covers name.
func (r Rule) hostMatches(name string) bool {
	if suffix, ok := strings.CutPrefix(r.Host, "*."); ok {
		return strings.HasSuffix(name, "."+suffix)
	}
	return r.Host != "" && name == r.Host
}

// AllowsName reports whether some rule lets the name be resolved (on
// whatever port).
func (p Policy) AllowsName(name string) bool {
	if p.Off {
		return false
	}
	for _, r := range p.Allow {
		if r.hostMatches(name) {
			return true
		}
	}
	return false
}

// allowsHostPort reports whether some rule allows name on port.
func (p Policy) allowsHostPort(name string, port uint16) bool {
	return p.nameAccess(name, port).allowed
}

// access is what the rules allow for a name on a port.
type access struct {
	allowed     bool // some rule covers it
	passthrough bool // some rule covering it says tls=passthrough
	tcp         bool // some rule covering it names the port: any TCP
}

// nameAccess is what the rules allow for name on port.
func (p Policy) nameAccess(name string, port uint16) access {
	var a access
	if p.Off {
		return a
	}
	for _, r := range p.Allow {
		if r.hostMatches(name) && (r.Port == 0 || r.Port == port) {
			a.allowed = true
			a.passthrough = a.passthrough || r.Passthrough
			a.tcp = a.tcp || r.Port == port
		}
	}
	return a
}

// allowsAddr reports whether some address rule allows addr on port.
func (p Policy) allowsAddr(addr netip.Addr, port uint16) bool {
	if p.Off {
		return false
	}
	for _, r := range p.Allow {
		if r.Host == "" && r.Prefix.Contains(addr) && (r.Port == 0 || r.Port == port) {
			return true
		}
	}
	return false
}

// namesExactly reports whether an address rule names addr itself (a /32
// or /128), the only way a name may lead to a special address, or a
// connection by address reach a host-only one.
func (p Policy) namesExactly(addr netip.Addr) bool {
	for _, r := range p.Allow {
		if r.Host == "" && r.Prefix.IsSingleIP() && r.Prefix.Addr() == addr {
			return true
		}
	}
	return false
}

// hostOnly reports whether addr means the host the gateway runs on, or
// its link, rather than a network: loopback, link-local (the metadata
// service's 169.254.169.254 among them), unspecified and "this network"
// (0.0.0.0/8), multicast and broadcast, in IPv4 or IPv6, also when an
// IPv6 address carries such an IPv4 one (mapped, compatible, NAT64 or
// 6to4 forms). A range rule (0.0.0.0/0, ::/0) does not reach these; only
// a rule naming the address. The gateway adds the addresses of the host
// itself (Config.HostAddr) and of other sandboxes' links (Config.Reserved).
func hostOnly(addr netip.Addr) bool {
	for _, a := range forms(addr) {
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() ||
			a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) ||
			a.Is4() && a.As4()[0] == 0 {
			return true
		}
	}
	return false
}

// special reports whether addr is one a name must not lead to unless the
// policy names it: what hostOnly says, private, CGNAT, the benchmarking
// range the gateway's synthetic addresses come from, and any IPv6 (names
// resolve to IPv4).
func special(addr netip.Addr) bool {
	if hostOnly(addr) || !addr.Unmap().Is4() {
		return true
	}
	a := addr.Unmap()
	return a.IsPrivate() || cgnat.Contains(a) || syntheticRange.Contains(a)
}

// forms returns addr (unmapped) and the IPv4 address an IPv6 one embeds,
// if it has the form of one that does: IPv4-compatible (::a.b.c.d),
// NAT64 (64:ff9b::/96) or 6to4 (2002:AABB:CCDD::/48). A translator on
// the host's network could carry a connection to such an address to the
// IPv4 one.
func forms(addr netip.Addr) []netip.Addr {
	addr = addr.Unmap()
	if !addr.Is6() {
		return []netip.Addr{addr}
	}
	b := addr.As16()
	out := []netip.Addr{addr}
	switch {
	case compat4.Contains(addr) && !addr.IsUnspecified() && !addr.IsLoopback(), nat64.Contains(addr):
		out = append(out, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	case sixToFour.Contains(addr):
		out = append(out, netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
	}
	return out
}

var (
	cgnat     = netip.MustParsePrefix("100.64.0.0/10")
	compat4   = netip.MustParsePrefix("::/96")
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)
