package worker

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"space/internal/egress"
)

// readAudit reads the audit file at path as OpenEgressLog does.
func readAudit(t *testing.T, path string) []egress.Event {
	t.Helper()
	rc, err := openAuditLog(path)
	if err != nil {
		t.Fatalf("openAuditLog: %v", err)
	}
	defer rc.Close()
	var out []egress.Event
	sc := bufio.NewScanner(rc)
	for sc.Scan() {
		var ev egress.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %d %q: %v", len(out)+1, sc.Text(), err)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// flood writes n events named e<first> on to the
// audit file at path, in one writer or, with reopen, one per 1000 events
// (a worker restarting in the middle).
func flood(t *testing.T, path string, first, n int, headMax, tailMax int64, reopen bool) {
	t.Helper()
	w, err := openAuditWriter(path, headMax, tailMax)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1e9, 0).UTC()
	for i := first; i < first+n; i++ {
		if reopen && i > first && i%1000 == 0 {
			if err := w.close(); err != nil {
				t.Fatal(err)
			}
			if w, err = openAuditWriter(path, headMax, tailMax); err != nil {
				t.Fatal(err)
			}
		}
		ev := egress.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Proto: "tcp", Name: "e" + strconv.Itoa(i), Reason: "refused"}
		if err := w.write(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
}

// TestAuditFileKeepsHeadAndTail: a flood many times the rotation size
// keeps the run's first events and its last, with a line counting what
// was dropped between them, in order.
func TestAuditFileKeepsHeadAndTail(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reopen bool
	}{{"one writer", false}, {"a writer per 1000 events", true}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "egress.log")
			const n, headMax, tailMax = 20_000, 4 << 10, 16 << 10 // about 1.6 MB of lines
			flood(t, path, 0, n, headMax, tailMax, tc.reopen)
			evs := readAudit(t, path)
			if len(evs) == 0 || evs[0].Name != "e0" || evs[len(evs)-1].Name != "e"+strconv.Itoa(n-1) {
				t.Fatalf("the log's first and last events: %+v ... %+v, want e0 ... e%d", evs[0], evs[len(evs)-1], n-1)
			}
			total, gaps, next := 0, 0, 0
			for _, ev := range evs {
				if ev.Proto == "audit" {
					gaps++
					total += ev.Count
					next += ev.Count
					continue
				}
				if ev.Name != "e"+strconv.Itoa(next) {
					t.Fatalf("event %q where e%d was due: the log is out of order or lost an event uncounted", ev.Name, next)
				}
				total++
				next++
			}
			if gaps != 1 || total != n {
				t.Errorf("%d gap lines, %d events counted; want 1 and %d", gaps, total, n)
			}
			if len(evs) > 3*(headMax+2*tailMax)/64 {
				t.Errorf("%d lines kept of %d: the log is not bounded", len(evs), n)
			}
			t.Logf("%d lines kept of %d events", len(evs), n)
		})
	}
}

// TestAuditFileUnrotated: a log short of its rotation is read whole, and
// an old log without a head stays a tail.
func TestAuditFileUnrotated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.log")
	flood(t, path, 0, 10, 1<<20, 1<<20, false)
	if evs := readAudit(t, path); len(evs) != 10 {
		t.Errorf("%d events read, want 10", len(evs))
	}
	old := filepath.Join(t.TempDir(), "egress.log")
	if err := os.WriteFile(old, []byte(`{"time":"2001-09-09T01:46:40Z","allowed":false,"proto":"tcp","name":"legacy"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flood(t, old, 0, 10, 1<<20, 1<<20, false)
	if evs := readAudit(t, old); len(evs) != 11 || evs[0].Name != "legacy" || evs[10].Name != "e9" {
		t.Errorf("%d events read (%+v), want 11 from legacy to e9", len(evs), evs)
	}
	if _, err := os.Stat(old + headSuffix); err == nil {
		t.Errorf("a log begun without a head got one")
	}
}

// TestAuditFileQueue: events queued to the audit file reach it, with a
// line counting those dropped while the writer fell behind.
func TestAuditFileQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.log")
	a := &auditFile{path: path, log: slog.New(slog.DiscardHandler), ch: make(chan egress.Event, 1024), done: make(chan struct{})}
	go a.run()
	for i := range 5000 {
		a.write(egress.Event{Proto: "tcp", Name: "e" + strconv.Itoa(i)})
	}
	a.close()
	a.write(egress.Event{Proto: "tcp", Name: "after close"})
	total := 0
	for _, ev := range readAudit(t, path) {
		total += max(ev.Count, 1)
	}
	if total != 5000 {
		t.Errorf("the log counts %d events, want 5000", total)
	}
}
