package webhook

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"

	"space/internal/errkind"
)

// Guard decides which URLs a webhook may point at, so that a team cannot
// make the control plane send requests into its own network (server-side
// request forgery): a URL must be https, without userinfo, and every
// address its host resolves to must be public. Refused are loopback,
// private (RFC 1918, fc00::/7), link-local (169.254/16 with the cloud
// metadata address 169.254.169.254, fe80::/10), unspecified and "this
// network" (0/8), multicast and broadcast, shared (CGNAT, 100.64/10),
// their IPv4-mapped IPv6 forms, and every address of this host's own
// interfaces.
//
// AllowPrivate (an administrator's setting, for a control plane whose
// receivers live on its own network) lifts every address rule and also
// admits plain http.
//
// CheckURL judges a URL when it is registered; Control judges each
// address actually dialed, so a name that resolved to a public address at
// registration and to a private one later (DNS rebinding) is refused at
// delivery.
type Guard struct {
	// AllowPrivate admits any address and http as well as https.
	AllowPrivate bool
	// Resolver resolves host names; nil = net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// LocalAddrs lists this host's interface addresses; nil = those of
	// net.InterfaceAddrs.
	LocalAddrs func() ([]netip.Addr, error)
}

// refusedPrefixes are ranges no webhook may reach (besides what netip's
// predicates catch).
var refusedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),          // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),      // shared address space (CGNAT)
	netip.MustParsePrefix("192.0.0.0/24"),       // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),      // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),        // reserved, and broadcast
	netip.MustParsePrefix("64:ff9b::/96"),       // NAT64: an IPv4 address behind it
	netip.MustParsePrefix("64:ff9b:1::/48"),     // local-use NAT64
	netip.MustParsePrefix("2002::/16"),          // 6to4: an IPv4 address inside
	netip.MustParsePrefix("100::/64"),           // discard-only
	netip.MustParsePrefix("2001:db8::/32"),      // documentation
	netip.MustParsePrefix("fec0::/10"),          // deprecated site-local
	netip.MustParsePrefix("::ffff:0:0:0/96"),    // IPv4-translated
	netip.MustParsePrefix("2001::/32"),          // Teredo: an IPv4 address inside
	netip.MustParsePrefix("169.254.169.254/32"), // cloud metadata (link-local too; named for the message)
}

// CheckURL returns nil if raw may be a webhook's URL: it parses, has an
// allowed scheme and no userinfo, and its host resolves only to allowed
// addresses. Its errors wrap errkind.InvalidArgument and name what was
// refused ("url https://x/: x resolves to 10.0.0.5, a private address").
func (g *Guard) CheckURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q: %v: %w", raw, err, errkind.InvalidArgument)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && g.AllowPrivate:
	case u.Scheme == "http":
		return fmt.Errorf("url %s: must be https (http is allowed only when the server allows private webhook targets): %w", raw, errkind.InvalidArgument)
	default:
		return fmt.Errorf("url %s: scheme %q (want https): %w", raw, u.Scheme, errkind.InvalidArgument)
	}
	if u.User != nil {
		return fmt.Errorf("url %s: must not carry a user or password: %w", raw, errkind.InvalidArgument)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("url %s: no host: %w", raw, errkind.InvalidArgument)
	}
	if u.Fragment != "" {
		return fmt.Errorf("url %s: must not have a fragment: %w", raw, errkind.InvalidArgument)
	}
	if g.AllowPrivate {
		return nil
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = g.resolver().LookupNetIP(ctx, "ip", host)
		if err != nil {
			return fmt.Errorf("url %s: resolve %s: %v: %w", raw, host, err, errkind.InvalidArgument)
		}
		if len(addrs) == 0 {
			return fmt.Errorf("url %s: %s resolves to no address: %w", raw, host, errkind.InvalidArgument)
		}
	}
	for _, a := range addrs {
		why := g.refused(a)
		switch {
		case why == "":
		case a.String() == host:
			return fmt.Errorf("url %s: %s is %s (the server does not allow private webhook targets): %w", raw, a, why, errkind.InvalidArgument)
		default:
			return fmt.Errorf("url %s: %s resolves to %s, %s (the server does not allow private webhook targets): %w", raw, host, a, why, errkind.InvalidArgument)
		}
	}
	return nil
}

// Control is a [net.Dialer] Control function: it refuses to connect to an
// address CheckURL would refuse. address is what is about to be dialed,
// after resolution.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	if g.AllowPrivate {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhook dial %s: %w", address, err)
	}
	if why := g.refused(ap.Addr()); why != "" {
		return fmt.Errorf("webhook dial %s refused: %s (the server does not allow private webhook targets)", address, why)
	}
	return nil
}

// refused says why a may not be reached ("a private address"), or "" if
// it may.
func (g *Guard) refused(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	switch {
	case !a.IsValid():
		return "not an address"
	case a.IsLoopback():
		return "a loopback address"
	case a == netip.MustParseAddr("169.254.169.254"):
		return "the cloud metadata address"
	case a.IsPrivate():
		return "a private address"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast address"
	}
	for _, p := range refusedPrefixes {
		if p.Contains(a) {
			return "a reserved address (" + p.String() + ")"
		}
	}
	local, err := g.localAddrs()
	if err != nil {
		return "unknown: this host's addresses cannot be listed (" + err.Error() + ")"
	}
	for _, l := range local {
		if l.Unmap().WithZone("") == a {
			return "an address of this host"
		}
	}
	return ""
}

func (g *Guard) resolver() interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
} {
	if g.Resolver != nil {
		return g.Resolver
	}
	return net.DefaultResolver
}

func (g *Guard) localAddrs() ([]netip.Addr, error) {
	if g.LocalAddrs != nil {
		return g.LocalAddrs()
	}
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if p, err := netip.ParsePrefix(ifa.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}
