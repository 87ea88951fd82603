package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"
)

// Synthetic names. The gateway's DNS gives each allowed name an address
// of the synthetic range, and a connection to that address is a
// connection to the name: the gateway resolves the name itself, with the
// host's resolver (Config.Resolve). Under a wildcard rule the guest picks
// the name, so those lookups are a channel from the guest to the
// resolver and whoever runs the zone. The channel is bounded: the
// distinct names DNS answers under wildcard rules come out of a token
// bucket of Config.WildcardNames, refilled at
// Config.WildcardNamesPerMinute, and only names with an address reach
// the resolver. A name carries at most 253 bytes, so the channel carries
// at most
//
//	253 * WildcardNamesPerMinute bytes a minute, after a first 253 * WildcardNames
//
// which with the defaults (30 a minute, 256) is 7,590 bytes a minute
// after 64,768 (about 520 kB in a sandbox's first hour). A name beyond
// the bucket is answered REFUSED (with an extended DNS error, Prohibited,
// when the query has EDNS) and audited. Names an exact rule allows are
// not limited: the policy chose them, not the guest.
//
// The addresses are recycled: when the range is used up, a new name takes
// the address of the name used least recently (answered or connected
// to), but never one pinned by an open connection. A guest that still
// holds a recycled address reaches the new name's address; its
// connection names the old name (SNI, Host) and is refused.
//
// Connection code looks a destination up with
//
//	name, ok := g.names.pin(addr)
//	if ok {
//		defer g.names.unpin(addr)
//	}
//
// for as long as the connection is open; name (no pin) is for a
// decision that holds no connection open.

// DefaultWildcardNames and DefaultWildcardNamesPerMinute are
// Config.WildcardNames and Config.WildcardNamesPerMinute when 0.
const (
	DefaultWildcardNames          = 256
	DefaultWildcardNamesPerMinute = 30
)

// maxNameBytes is the most a DNS name carries (in its presentation form,
// without the final dot).
const maxNameBytes = 253

// The errors of nameTable.addr (immutable; checklocks would have them
// guarded by the mutex they are read under).
var (
	errWildcardLimit = errors.New("too many distinct names under wildcard rules")            // +checklocksignore
	errNoAddress     = errors.New("every synthetic address is in use by an open connection") // +checklocksignore
)

// nameTable maps allowed names to synthetic addresses and back, and
// recycles the addresses least recently used.
type nameTable struct {
	prefix   netip.Prefix     // +checklocksignore: immutable; the synthetic range
	wildcard *rate.Limiter    // +checklocksignore: immutable; new names under wildcard rules (safe for concurrent use)
	now      func() time.Time // +checklocksignore: immutable; the bucket's clock

	mu sync.Mutex
	// +checklocks:mu
	byName map[string]*nameEntry
	// +checklocks:mu
	byAddr map[netip.Addr]*nameEntry
	// +checklocks:mu
	lru nameEntry // the sentinel of a ring of entries, the least recently used first (lru.next)
	// +checklocks:mu
	next netip.Addr // the next address never given out, or invalid: all were
}

// nameEntry is one name's address. Its fields are guarded by the
// table's mu (which checklocks cannot name from here).
type nameEntry struct {
	name string     // +checklocksignore
	addr netip.Addr // +checklocksignore
	pins int        // +checklocksignore: open connections to addr
	prev *nameEntry // +checklocksignore: in the table's lru ring
	next *nameEntry // +checklocksignore
}

func newNameTable(prefix netip.Prefix, burst, perMinute int, now func() time.Time) *nameTable {
	t := &nameTable{
		prefix: prefix, now: now,
		wildcard: rate.NewLimiter(rate.Limit(float64(perMinute)/60), burst),
		byName:   map[string]*nameEntry{}, byAddr: map[netip.Addr]*nameEntry{},
		next: prefix.Masked().Addr().Next(),
	}
	t.lru.prev, t.lru.next = &t.lru, &t.lru
	return t
}

// touchLocked makes e the most recently used, adding it to the ring if
// it is not in it.
//
// +checklocks:t.mu
func (t *nameTable) touchLocked(e *nameEntry) {
	if e.next != nil {
		e.prev.next, e.next.prev = e.next, e.prev
	}
	e.prev, e.next = t.lru.prev, &t.lru
	t.lru.prev.next = e
	t.lru.prev = e
}

// addr returns name's address, giving it one on first use (recycling the
// least recently used one's when the range is used up). A new name under
// a wildcard rule (wildcard true) costs a token of the bucket:
// errWildcardLimit when there is none. errNoAddress when every address
// is pinned.
func (t *nameTable) addr(name string, wildcard bool) (netip.Addr, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byName[name]; ok {
		t.touchLocked(e)
		return e.addr, nil
	}
	a, victim := t.freeLocked()
	if !a.IsValid() {
		return netip.Addr{}, errNoAddress
	}
	if wildcard && !t.wildcard.AllowN(t.now(), 1) {
		return netip.Addr{}, errWildcardLimit
	}
	if victim != nil {
		t.removeLocked(victim)
	}
	t.addLocked(name, a)
	return a, nil
}

// freeLocked finds the address a new name gets: one never given out, or
// else the least recently used unpinned one's (victim, its entry).
//
// +checklocks:t.mu
func (t *nameTable) freeLocked() (a netip.Addr, victim *nameEntry) {
	if t.next.IsValid() {
		return t.next, nil
	}
	for e := t.lru.next; e != &t.lru; e = e.next {
		if e.pins == 0 {
			return e.addr, e
		}
	}
	return netip.Addr{}, nil
}

// advanceLocked moves next past the addresses in use.
//
// +checklocks:t.mu
func (t *nameTable) advanceLocked() {
	for t.next.IsValid() && t.byAddr[t.next] != nil {
		t.next = t.next.Next()
		if !t.prefix.Contains(t.next) {
			t.next = netip.Addr{}
		}
	}
}

// next0 is the address that is never given out: the range's first.
func (t *nameTable) next0() netip.Addr { return t.prefix.Masked().Addr() }

// +checklocks:t.mu
func (t *nameTable) addLocked(name string, a netip.Addr) {
	e := &nameEntry{name: name, addr: a}
	t.touchLocked(e)
	t.byName[name], t.byAddr[a] = e, e
	t.advanceLocked()
}

// +checklocks:t.mu
func (t *nameTable) removeLocked(e *nameEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	delete(t.byName, e.name)
	delete(t.byAddr, e.addr)
}

// name returns the name a's was given for, as recently used.
func (t *nameTable) name(a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byAddr[a]
	if !ok {
		return "", false
	}
	t.touchLocked(e)
	return e.name, true
}

// pin is name for a connection that stays open: a keeps its name until
// as many unpin calls.
func (t *nameTable) pin(a netip.Addr) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byAddr[a]
	if !ok {
		return "", false
	}
	e.pins++
	t.touchLocked(e)
	return e.name, true
}

// unpin undoes a pin of a (the connection closed).
func (t *nameTable) unpin(a netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byAddr[a]; ok && e.pins > 0 {
		e.pins--
		t.touchLocked(e)
	}
}

func (t *nameTable) all() map[string]netip.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]netip.Addr, len(t.byName))
	for n, e := range t.byName {
		out[n] = e.addr
	}
	return out
}

// load takes over another table's names (they cost no token: the
// parent's gateway counted them), where their addresses are free.
func (t *nameTable) load(m map[string]netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for n, a := range m {
		if t.prefix.Contains(a) && a != t.next0() && t.byAddr[a] == nil && t.byName[n] == nil {
			t.addLocked(n, a)
		}
	}
}

// allowsExactName reports whether a rule names name itself (not by a
// wildcard).
func (p Policy) allowsExactName(name string) bool {
	for _, r := range p.Allow {
		if r.Host == name {
			return true
		}
	}
	return false
}

// refuseName answers a query for a name beyond the wildcard names'
// bucket: REFUSED, with an extended error when the query has EDNS.
func (g *Gateway) refuseName(q, resp *dns.Msg, ev *Event) {
	resp.Rcode = dns.RcodeRefused
	g.cfg.Metrics.wildcardHit()
	ev.Allowed = false
	ev.Reason = fmt.Sprintf("more distinct names under wildcard rules than the sandbox may resolve (%d, and %d more a minute)",
		g.cfg.WildcardNames, g.cfg.WildcardNamesPerMinute)
	if opt := q.IsEdns0(); opt != nil {
		resp.SetEdns0(opt.UDPSize(), false)
		ro := resp.IsEdns0()
		ro.Option = append(ro.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited, ExtraText: ev.Reason})
	}
}
