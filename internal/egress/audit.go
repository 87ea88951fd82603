package egress

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Audit aggregation. The guest can cause refusals as fast as it sends
// frames (a port scan, a flood of queries), and one line each would let
// it fill the sandbox's egress log with noise. So the gateway aggregates
// what repeats: refusals of every kind, DNS answers and pings. Their
// destination and reason are the key (protocol, allowed or not, name,
// address, reason; not the port, nor the port in the reason, so a scan of
// one host's ports is one key). The first event of
// a key is written at once; later ones are counted, and at the end of
// the interval (Config.AuditInterval) each key that had some is written
// as one line with Event.Count, the port range it covered, and summed
// byte counts; a key idle for an interval is forgotten. At most
// maxAuditKeys keys are listed one by one; events for destinations beyond
// those are counted in one line per protocol and outcome. So an interval
// writes at most 2*maxAuditKeys lines and a few more, whatever the guest
// does. Allowed connections are never aggregated: each is one line when
// it closes, with its byte counts. Close writes what is pending.

// DefaultAuditInterval is Config.AuditInterval when it is 0.
const DefaultAuditInterval = 10 * time.Second

// maxAuditKeys bounds the destinations an interval lists one by one.
const maxAuditKeys = 64

// maxAuditPorts bounds the distinct ports a line counts exactly.
const maxAuditPorts = 1024

// auditKey is what aggregated events have in common.
type auditKey struct {
	proto   string
	mode    string // how a connection or request was served (Event.Mode)
	allowed bool
	name    string
	addr    string
	reason  string // with the port masked
}

// auditEntry counts a key's events since its last line.
type auditEntry struct {
	first            Event // the first event counted
	last             time.Time
	count            int
	minPort, maxPort uint16
	ports            map[uint16]bool // up to maxAuditPorts; nil until a second port
	bytesIn          int64
	bytesOut         int64
}

func (e *auditEntry) note(ev Event) {
	if e.count == 0 {
		e.first, e.minPort, e.maxPort = ev, ev.Port, ev.Port
	}
	e.count += max(ev.Count, 1)
	e.last = ev.Time
	if ev.Port != e.minPort || ev.Port != e.maxPort {
		if e.ports == nil {
			e.ports = map[uint16]bool{e.minPort: true}
		}
		if len(e.ports) < maxAuditPorts {
			e.ports[ev.Port] = true
		}
		e.minPort, e.maxPort = min(e.minPort, ev.Port), max(e.maxPort, ev.Port)
	}
	e.bytesIn += ev.BytesIn
	e.bytesOut += ev.BytesOut
}

// maskPort is reason without the number port where it appears whole
// (not as part of another number or an address).
func maskPort(reason string, port uint16) string {
	if port == 0 {
		return reason
	}
	p := strconv.Itoa(int(port))
	var b strings.Builder
	for {
		i := strings.Index(reason, p)
		if i < 0 {
			b.WriteString(reason)
			return b.String()
		}
		j := i + len(p)
		if (i == 0 || !inNumber(reason[i-1])) && (j == len(reason) || !inNumber(reason[j])) {
			b.WriteString(reason[:i] + "#")
		} else {
			b.WriteString(reason[:j])
		}
		reason = reason[j:]
	}
}

// inNumber reports whether c may be part of a number or address around
// a port's digits.
func inNumber(c byte) bool { return c >= '0' && c <= '9' || c == '.' }

// summary is the line for the entry's events.
func (e *auditEntry) summary() Event {
	ev := e.first
	ev.Time, ev.Count, ev.BytesIn, ev.BytesOut = e.last, e.count, e.bytesIn, e.bytesOut
	if e.minPort != e.maxPort {
		n := strconv.Itoa(len(e.ports))
		if len(e.ports) >= maxAuditPorts {
			n = "at least " + n
		}
		ev.Port = 0
		ev.Reason = join(ev.Reason, fmt.Sprintf("%s ports from %d to %d", n, e.minPort, e.maxPort))
	}
	return ev
}

// overflowSummary is the line for events beyond the keys listed.
func (e *auditEntry) overflowSummary() Event {
	first := e.first
	to := first.Name
	if to == "" {
		to = first.Addr
	}
	if first.Port != 0 {
		to += " port " + strconv.Itoa(int(first.Port))
	}
	reason := fmt.Sprintf("%d events to destinations beyond the %d the log lists one by one in an interval; the first to %s", e.count, maxAuditKeys, to)
	return Event{Time: e.last, Allowed: first.Allowed, Proto: first.Proto, Count: e.count,
		BytesIn: e.bytesIn, BytesOut: e.bytesOut, Reason: join(reason, first.Reason)}
}

func join(reason, note string) string {
	if reason == "" {
		return note
	}
	return reason + " (" + note + ")"
}

// aggregator aggregates a gateway's audit events (see above). Its run
// goroutine writes the interval's lines; close stops it and writes what
// is pending.
type aggregator struct {
	emit     func(Event) // Config.Audit
	interval time.Duration
	stop     chan struct{}
	done     chan struct{}

	mu sync.Mutex
	// +checklocks:mu
	keys map[auditKey]*auditEntry // listed one by one (at most maxAuditKeys)
	// +checklocks:mu
	overflow map[auditKey]*auditEntry // by proto and allowed only
	// +checklocks:mu
	closed bool // events then go straight to emit
}

func newAggregator(emit func(Event), interval time.Duration) *aggregator {
	return &aggregator{emit: emit, interval: interval, stop: make(chan struct{}), done: make(chan struct{}),
		keys: map[auditKey]*auditEntry{}, overflow: map[auditKey]*auditEntry{}}
}

// aggregated reports whether ev is one of the events aggregated.
func aggregated(ev Event) bool {
	return !ev.Allowed || ev.Proto == "dns" || ev.Proto == "icmp" || ev.Proto == "icmp6"
}

// add writes ev, or counts it for a later line.
func (a *aggregator) add(ev Event) {
	if !aggregated(ev) {
		a.emit(ev)
		return
	}
	key := auditKey{proto: ev.Proto, mode: ev.Mode, allowed: ev.Allowed, name: ev.Name, addr: ev.Addr, reason: maskPort(ev.Reason, ev.Port)}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.emit(ev)
		return
	}
	e := a.keys[key]
	if e == nil && len(a.keys) < maxAuditKeys {
		a.keys[key] = &auditEntry{}
		a.mu.Unlock()
		a.emit(ev) // a new destination: at once
		return
	}
	if e == nil {
		okey := auditKey{proto: ev.Proto, allowed: ev.Allowed}
		if e = a.overflow[okey]; e == nil {
			e = &auditEntry{}
			a.overflow[okey] = e
		}
	}
	e.note(ev)
	a.mu.Unlock()
}

// run writes the lines of each interval until close.
func (a *aggregator) run() {
	defer close(a.done)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			a.flush(false)
		case <-a.stop:
			a.flush(true)
			return
		}
	}
}

// flush writes a line for each key with events counted, and forgets the
// keys without; final stops the aggregation.
func (a *aggregator) flush(final bool) {
	var out []Event
	a.mu.Lock()
	for k, e := range a.keys {
		if e.count == 0 {
			delete(a.keys, k)
			continue
		}
		out = append(out, e.summary())
		*e = auditEntry{}
	}
	for k, e := range a.overflow {
		out = append(out, e.overflowSummary())
		delete(a.overflow, k)
	}
	a.closed = a.closed || final
	a.mu.Unlock()
	slices.SortStableFunc(out, func(x, y Event) int { return x.Time.Compare(y.Time) })
	for _, ev := range out {
		a.emit(ev)
	}
}

// close writes what is pending; events after it are written at once.
// Call it once.
func (a *aggregator) close() {
	close(a.stop)
	<-a.done
}
