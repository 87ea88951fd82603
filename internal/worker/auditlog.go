package worker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"space/internal/egress"
)

// A sandbox's egress audit file keeps the head and the tail of a run,
// however much the guest makes its gateway write: the first
// maxEgressLogHead bytes go to egress.log.head, which is never rotated;
// what follows goes to egress.log, rotated at maxEgressLog to
// egress.log.1 (one previous file kept). What a rotation drops between
// them is counted in egress.log.gap, and a reader gets head, a line saying
// what was dropped (proto "audit", with a count), then the tail.
// (A log from before the head file has no head: it stays tail only.)

// maxEgressLog is the size at which the tail of the audit file is
// rotated (one previous file is kept); maxEgressLogHead is the size of
// its head.
const (
	maxEgressLog     = 16 << 20
	maxEgressLogHead = 4 << 20
)

// The audit file's parts, after the sandbox's egressLog path.
const (
	headSuffix = ".head"
	prevSuffix = ".1"
	gapSuffix  = ".gap"
)

// auditGap is what rotation dropped between the head and the tail.
type auditGap struct {
	Events int64     `json:"events"`
	Bytes  int64     `json:"bytes"`
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
}

// auditFile appends egress events to a sandbox's audit file.
type auditFile struct {
	path string
	log  *slog.Logger
	ch   chan egress.Event
	done chan struct{}
	lost atomic.Int64 // events dropped since the last one written
	// mu orders writes before close: a gateway's connection handlers may
	// still finish (and audit) after the sandbox's gateway is closed.
	mu sync.RWMutex
	// +checklocks:mu
	closed bool
}

func (w *Worker) auditor(s *sbx) *auditFile {
	a := &auditFile{path: s.egressLog(), log: w.log.With("sandbox_id", s.id()), ch: make(chan egress.Event, 1024), done: make(chan struct{})}
	go a.run()
	return a
}

// write queues an event; when the writer falls behind (1024 queued),
// the event is dropped rather than blocking the gateway, and the next
// one written says how many were.
func (a *auditFile) write(ev egress.Event) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return
	}
	select {
	case a.ch <- ev:
	default:
		a.lost.Add(1)
	}
}

func (a *auditFile) close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.ch)
	}
	a.mu.Unlock()
	<-a.done
}

func (a *auditFile) run() {
	defer close(a.done)
	w, err := openAuditWriter(a.path, maxEgressLogHead, maxEgressLog)
	if err != nil {
		a.log.Warn("egress audit file", "err", err)
		for range a.ch {
		}
		return
	}
	failed := false
	for ev := range a.ch {
		if n := a.lost.Swap(0); n > 0 {
			err = errors.Join(err, w.write(egress.Event{Time: ev.Time, Proto: "audit", Count: int(n),
				Reason: fmt.Sprintf("%d events dropped: the log fell behind", n)}))
		}
		err = errors.Join(err, w.write(ev))
		if len(a.ch) == 0 {
			err = errors.Join(err, w.flush())
		}
		if err != nil && !failed {
			a.log.Warn("egress audit file", "err", err) // once: it would repeat for every event
			failed = true
		}
		err = nil
	}
	if n := a.lost.Swap(0); n > 0 {
		err = w.write(egress.Event{Time: time.Now().UTC(), Proto: "audit", Count: int(n), Reason: fmt.Sprintf("%d events dropped: the log fell behind", n)})
	}
	if err := errors.Join(err, w.close()); err != nil {
		a.log.Warn("egress audit file", "err", err)
	}
}

// auditWriter writes the parts of an audit file. It is run's alone.
type auditWriter struct {
	path             string
	headMax, tailMax int64
	f                *os.File // or nil after a failed rotation
	bw               *bufio.Writer
	size             int64 // of f
	inHead           bool
}

// openAuditWriter opens the audit file at path to append to: its head
// while that is short of headMax and no tail was begun, else its tail.
func openAuditWriter(path string, headMax, tailMax int64) (*auditWriter, error) {
	w := &auditWriter{path: path, headMax: headMax, tailMax: tailMax}
	_, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		w.inHead = true
	case err != nil:
		return nil, err
	}
	name := path
	if w.inHead {
		name = path + headSuffix
	}
	if err := w.open(name); err != nil {
		return nil, err
	}
	if w.inHead && w.size >= headMax {
		if err := w.endHead(); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func (w *auditWriter) open(name string) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return err
	}
	w.f, w.size = f, size
	if w.bw == nil {
		w.bw = bufio.NewWriter(f)
	} else {
		w.bw.Reset(f)
	}
	return nil
}

// write appends one event's line.
func (w *auditWriter) write(ev egress.Event) error {
	if w.f == nil {
		return errors.New("egress audit file: closed after a failed rotation")
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	n, err := w.bw.Write(append(b, '\n'))
	w.size += int64(n)
	if err != nil {
		return err
	}
	switch {
	case w.inHead && w.size >= w.headMax:
		return w.endHead()
	case !w.inHead && w.size >= w.tailMax:
		return w.rotate()
	}
	return nil
}

func (w *auditWriter) flush() error {
	if w.f == nil {
		return nil
	}
	return w.bw.Flush()
}

// endHead closes the head, for good, and opens the tail.
func (w *auditWriter) endHead() error {
	err := errors.Join(w.bw.Flush(), w.f.Close())
	w.f, w.inHead = nil, false
	if err != nil {
		return err
	}
	return w.open(w.path)
}

// rotate moves the tail to its previous file, counting what that held
// as dropped, and begins a new one.
func (w *auditWriter) rotate() error {
	err := errors.Join(w.bw.Flush(), w.f.Close())
	w.f = nil
	if err != nil {
		return err
	}
	if err := countGap(w.path); err != nil {
		return err
	}
	if err := os.Rename(w.path, w.path+prevSuffix); err != nil {
		return err
	}
	return w.open(w.path)
}

// countGap adds what the tail's previous file holds to the gap file: it
// is about to be replaced.
func countGap(path string) error {
	b, err := os.ReadFile(path + prevSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	g, err := readGap(path)
	if err != nil {
		return err
	}
	events := int64(bytes.Count(b, []byte{'\n'}))
	if events == 0 {
		return nil
	}
	first, _, _ := bytes.Cut(b, []byte{'\n'})
	last := bytes.TrimSuffix(b, []byte{'\n'})
	last = last[bytes.LastIndexByte(last, '\n')+1:]
	var fe, le egress.Event
	json.Unmarshal(first, &fe)
	json.Unmarshal(last, &le)
	if g.Events == 0 {
		g.From = fe.Time
	}
	g.Events += events
	g.Bytes += int64(len(b))
	g.To = le.Time
	out, _ := json.Marshal(g)
	tmp := path + gapSuffix + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path+gapSuffix)
}

func readGap(path string) (auditGap, error) {
	var g auditGap
	b, err := os.ReadFile(path + gapSuffix)
	if errors.Is(err, os.ErrNotExist) {
		return g, nil
	}
	if err != nil {
		return g, err
	}
	if err := json.Unmarshal(b, &g); err != nil {
		return g, fmt.Errorf("%s: %w", path+gapSuffix, err)
	}
	return g, nil
}

func (w *auditWriter) close() error {
	if w.f == nil {
		return nil
	}
	err := errors.Join(w.bw.Flush(), w.f.Close())
	w.f = nil
	return err
}

// openAuditLog opens the audit file at path for reading, oldest first:
// the head, a line for what was dropped, the tail.
func openAuditLog(path string) (io.ReadCloser, error) {
	g, err := readGap(path)
	if err != nil {
		return nil, err
	}
	m := &multiFile{}
	var readers []io.Reader
	add := func(name string) error {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		m.files = append(m.files, f)
		readers = append(readers, f)
		return nil
	}
	if err := add(path + headSuffix); err != nil {
		m.Close()
		return nil, err
	}
	if g.Events > 0 {
		b, _ := json.Marshal(egress.Event{Time: g.To, Proto: "audit", Count: int(g.Events),
			Reason: fmt.Sprintf("%d events (%d bytes) from %s to %s dropped: the log keeps the first %d MiB of a run and its last %d to %d MiB",
				g.Events, g.Bytes, g.From.Format(time.RFC3339), g.To.Format(time.RFC3339), maxEgressLogHead>>20, maxEgressLog>>20, 2*maxEgressLog>>20)})
		readers = append(readers, bytes.NewReader(append(b, '\n')))
	}
	for _, name := range []string{path + prevSuffix, path} {
		if err := add(name); err != nil {
			m.Close()
			return nil, err
		}
	}
	m.Reader = io.MultiReader(readers...)
	return m, nil
}

type multiFile struct {
	io.Reader
	files []*os.File
}

func (m *multiFile) Close() error {
	var errs []error
	for _, f := range m.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
