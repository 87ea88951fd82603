package main

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"space/api"
	"space/client"
)

// networkFlags are the egress policy flags of sandbox create and sandbox
// network.
type networkFlags struct {
	hosts    []string // --allow-host
	passes   []string // --allow-passthrough
	cidrs    []string // --allow-cidr
	off      bool
	icmp     bool  // --allow-icmp
	maxConns int   // --max-connections
	bps      int64 // --bytes-per-second
}

// register adds --allow-host, --allow-cidr and offFlag (a bool taking
// the network away, described by offUsage) to f.
func (nf *networkFlags) register(f *pflag.FlagSet, offFlag, offUsage string) {
	f.StringArrayVar(&nf.hosts, "allow-host", nil,
		"allow connections to this `host`: a name, name:port, *.suffix or *.suffix:port (repeatable)")
	f.StringArrayVar(&nf.passes, "allow-passthrough", nil,
		"allow TLS to this `host` (as --allow-host) without the gateway terminating it: decided by its SNI alone, its requests unseen and given no secrets; for clients that pin certificates and non-HTTP protocols over TLS (repeatable)")
	f.StringArrayVar(&nf.cidrs, "allow-cidr", nil,
		"allow connections to this address `range`: an IPv4 or IPv6 CIDR or address, with an optional :port ([v6]:port) (repeatable)")
	f.BoolVar(&nf.off, offFlag, false, offUsage)
	f.BoolVar(&nf.icmp, "allow-icmp", false, "let pings through to what the --allow-* rules allow on every port")
	f.IntVar(&nf.maxConns, "max-connections", 0, "bound the connections open at once (0 = the server's 256)")
	f.Int64Var(&nf.bps, "bytes-per-second", 0, "bound the throughput of all connections together, each direction (0 = unlimited)")
}

// set reports whether any policy flag was given.
func (nf *networkFlags) set() bool {
	return len(nf.hosts) > 0 || len(nf.passes) > 0 || len(nf.cidrs) > 0 || nf.off || nf.icmp || nf.maxConns != 0 || nf.bps != 0
}

// network returns the policy the flags describe. The server checks the
// rules; this only keeps hosts and address ranges in their own flags.
func (nf *networkFlags) network() (api.Network, error) {
	n := api.Network{Off: nf.off, ICMP: nf.icmp, MaxConnections: nf.maxConns, BytesPerSecond: nf.bps}
	for _, h := range nf.hosts {
		if isAddrRule(h) {
			return api.Network{}, usagef("--allow-host %q is an address: use --allow-cidr", h)
		}
		n.Allow = append(n.Allow, h)
	}
	for _, h := range nf.passes {
		if isAddrRule(h) {
			return api.Network{}, usagef("--allow-passthrough %q is an address: connections to addresses are not inspected anyway (use --allow-cidr)", h)
		}
		n.Allow = append(n.Allow, h+" tls=passthrough")
	}
	for _, c := range nf.cidrs {
		if !isAddrRule(c) {
			return api.Network{}, usagef("--allow-cidr %q: want an IPv4 or IPv6 address or CIDR, with an optional :port", c)
		}
		n.Allow = append(n.Allow, c)
	}
	return n, nil
}

// isAddrRule reports whether rule is an address or address range with an
// optional ":port" (an IPv6 one in brackets).
func isAddrRule(rule string) bool {
	if rest, ok := strings.CutPrefix(rule, "["); ok {
		rule = strings.Replace(rest, "]", "", 1)
	}
	if strings.ContainsRune(rule, '/') {
		if _, err := netip.ParsePrefix(rule); err == nil {
			return true
		}
	}
	if _, err := netip.ParseAddr(rule); err == nil {
		return true
	}
	i := strings.LastIndexByte(rule, ':')
	if i < 0 {
		return false
	}
	if _, err := strconv.ParseUint(rule[i+1:], 10, 16); err != nil {
		return false
	}
	rest := rule[:i]
	if _, err := netip.ParsePrefix(rest); err == nil {
		return true
	}
	_, err := netip.ParseAddr(rest)
	return err == nil
}

// networkText describes a sandbox's egress policy in a line.
func networkText(n *api.Network) string {
	switch {
	case n == nil:
		return "none"
	case n.Off:
		if len(n.Allow) > 0 {
			return "off (allow " + strings.Join(n.Allow, ", ") + ")"
		}
		return "off"
	case len(n.Allow) == 0:
		return "allows nothing"
	case n.ICMP:
		return "allow " + strings.Join(n.Allow, ", ") + " (and pings to them)"
	}
	return "allow " + strings.Join(n.Allow, ", ")
}

func newSandboxNetworkCmd(g *globals) *cobra.Command {
	var (
		nf networkFlags
		n  api.Network
	)
	c := withOutput(g, &cobra.Command{
		Use:   "network ID [--allow-host H]... [--allow-cidr C]... [--off]",
		Short: "Replace a sandbox's egress policy",
		Long: `Replace the egress policy of a running sandbox with the rules given and
print the sandbox. New DNS queries and connections follow it; open
connections are left alone. Without rules the sandbox may reach nothing.
The rules are all the gateway allows: a granted secret's host left out
(create adds them as host:443) is unreachable, and its grant inert there.

Only a sandbox created with a network (sandbox create --network or an
--allow-* flag, or from a built template) has a policy to replace.`,
		Args: cobra.ExactArgs(1),
		// A bad flag is a usage error (one of RunE's would not be).
		PreRunE: func(cmd *cobra.Command, args []string) (err error) {
			n, err = nf.network()
			return err
		},
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Sandbox, error) {
		return cl.SetNetwork(cmd.Context(), args[0], n)
	}, g.printSandbox)
	nf.register(c.Flags(), "off", "take the network away, DNS included, whatever the rules say")
	return c
}

func newSandboxEgressLogCmd(g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "egress-log ID",
		Short: "Show a sandbox's egress decisions",
		Long: `Show what a sandbox's egress gateway allowed and refused, oldest first:
DNS queries, connections (an allowed one once it closed, with the bytes it
carried out and in) and dropped packets. With -o json the events are
printed as JSON lines.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			evs, err := cl.EgressLog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				for _, ev := range evs {
					if err := enc.Encode(ev); err != nil {
						return err
					}
				}
				return nil
			}
			return g.printTable([]string{"TIME", "ALLOWED", "PROTO", "MODE", "NAME", "ADDR", "PORT", "OUT", "IN", "REASON"},
				func(row func(...any)) {
					for _, ev := range evs {
						allowed, port, out, in := "no", "", "", ""
						if ev.Allowed {
							allowed = "yes"
						}
						if ev.Port != 0 {
							port = strconv.Itoa(int(ev.Port))
						}
						if ev.Allowed && ev.Proto == "tcp" {
							out, in = strconv.FormatInt(ev.BytesOut, 10), strconv.FormatInt(ev.BytesIn, 10)
						}
						row(ev.Time.Local().Format(time.RFC3339), allowed, ev.Proto, ev.Mode, ev.Name, ev.Addr, port, out, in, ev.Reason)
					}
				})
		},
	}
	outputFlag(c.Flags(), &output)
	return c
}
