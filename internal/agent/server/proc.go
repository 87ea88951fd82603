package server

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// takeoverGrace bounds how long a new attachment waits for the one it took
// over to finish sending the chunk in flight (and the error frame saying
// it was taken over) when that host does not read.
const takeoverGrace = 2 * time.Second

// errTakenOver ends an attachment that a newer one replaced.
var errTakenOver = fmt.Errorf("taken over by a newer attachment: %w", errkind.FailedPrecondition)

// errNoProcess is returned for an id the table does not have (never had, or
// forgot after the process exited).
var errNoProcess = fmt.Errorf("no such process: %w", errkind.NotFound)

// procTable holds every process the host started, by id, running or
// exited. Processes outlive the streams and connections that started them;
// the table owns their goroutines.
type procTable struct {
	log       *slog.Logger
	grace     time.Duration  // ExitGrace
	maxExited int            // +checklocksignore: immutable
	wg        sync.WaitGroup // one per supervised process

	mu sync.Mutex
	// +checklocks:mu
	lastID int64
	// +checklocks:mu
	procs map[int64]*process
	// +checklocks:mu
	exited []int64 // ids of exited processes still in procs, oldest first
	// +checklocks:mu
	closed bool
}

func newProcTable(log *slog.Logger, grace time.Duration) *procTable {
	return &procTable{log: log, grace: grace, maxExited: proto.ProcMaxExited, procs: map[int64]*process{}}
}

// process is one process of the table: a process group led by pid, its
// output log and at most one attachment.
type process struct {
	// Set before the process is shared, never changed.
	id           int64 // +checklocksignore
	pid          int   // +checklocksignore
	argv         []string
	shell        string
	cwd          string
	tag          string
	started      time.Time
	killOnDetach bool
	out          *outputLog
	stdin        *os.File // or nil: the stdin pipe, or the pty master
	isPTY        bool
	unlisted     bool // forgotten as soon as it exits

	mu sync.Mutex
	// +checklocks:mu
	reaped bool // the leader was reaped: its pid may now be someone else's
	// +checklocks:mu
	exit *proto.Exit // or nil while running
	// +checklocks:mu
	att *attachment // or nil when detached
	// +checklocks:mu
	stdinClosed bool
	// +checklocks:mu
	stdinWriter *attachment   // whose write to stdin is under way, or nil
	stdinTurn   chan struct{} // +checklocksignore: holds a token while a write to stdin is under way; immutable
}

// kill signals the process group, unless the leader was already reaped.
// Children left behind keep the group alive after the leader exits; they
// are deliberately not chased then.
func (p *process) kill(sig unix.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped && p.pid > 0 { // -0 would be the agent's own group
		unix.Kill(-p.pid, sig)
	}
}

func (p *process) markReaped() {
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
}

// attach makes a the process's attachment and returns the one it replaced,
// or nil.
func (p *process) attach(a *attachment) (old *attachment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old, p.att = p.att, a
	p.out.setHold(true)
	return old
}

// join returns an observer of the output if the process has a live
// attachment, or attaches a like attach when it has none.
func (p *process) join(a *attachment) *observer {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.att != nil {
		return p.out.observe()
	}
	p.att = a
	p.out.setHold(true)
	return nil
}

// detach ends a's hold on the process and reports whether a was still its
// attachment (rather than taken over).
func (p *process) detach(a *attachment) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.att != a {
		return false
	}
	p.att = nil
	p.out.setHold(false)
	return true
}

func (p *process) exitStatus() (proto.Exit, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit == nil {
		return proto.Exit{}, false
	}
	return *p.exit, true
}

func (p *process) info() proto.ProcInfo {
	i := proto.ProcInfo{
		ID: p.id, PID: p.pid, Argv: p.argv, Shell: p.shell, Cwd: p.cwd, PTY: p.isPTY, Tag: p.tag,
		StartedUnixMS: p.started.UnixMilli(),
	}
	p.mu.Lock()
	i.Running = p.exit == nil
	if p.exit != nil {
		e := *p.exit
		i.Exit = &e
	}
	i.Attached = p.att != nil
	p.mu.Unlock()
	i.BufferedBytes, i.DroppedBytes = p.out.stats()
	return i
}

// writeStdin writes b to the process's input, waiting as long as the
// process takes to read it. proc.input writes this way.
func (p *process) writeStdin(b []byte) { p.writeStdinFor(nil, b) }

// writeStdinFor writes b to the process's input for attachment a, or for
// no attachment with a nil. A write for an attachment gives up, with part
// of b or none written, once the attachment ends: a process that does
// not read its input then holds nothing of an attachment that is gone (a
// ring slot, above all).
func (p *process) writeStdinFor(a *attachment, b []byte) {
	if p.stdin == nil {
		return
	}
	var stop <-chan struct{}
	if a != nil {
		stop = a.stop
	}
	select {
	case p.stdinTurn <- struct{}{}: // one write at a time, whole
	case <-stop:
		return
	}
	defer func() { <-p.stdinTurn }()
	p.mu.Lock()
	if p.stdinClosed || (a != nil && a.reason() != live) {
		p.mu.Unlock()
		return
	}
	p.stdinWriter = a
	// Under mu: an abort for a (abortStdin) comes after this, never
	// before it and then undone.
	p.stdin.SetWriteDeadline(time.Time{})
	p.mu.Unlock()
	// An error means the process closed its end (or it exited), or the
	// attachment ended: the bytes have nowhere to go.
	p.stdin.Write(b)
	p.mu.Lock()
	p.stdinWriter = nil
	p.mu.Unlock()
}

// abortStdin ends a write to the process's input made for a, which ended.
// A terminal or pipe the poller cannot time out keeps the write waiting.
func (p *process) abortStdin(a *attachment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a != nil && p.stdinWriter == a {
		p.stdin.SetWriteDeadline(time.Now())
	}
}

// closeStdin closes the process's stdin, or sends ^D to its terminal.
func (p *process) closeStdin() { p.closeStdinFor(nil) }

// closeStdinFor is closeStdin for attachment a (nil: for none); on a
// terminal, the ^D is a write as writeStdinFor makes it.
func (p *process) closeStdinFor(a *attachment) {
	if p.stdin == nil {
		return
	}
	if p.isPTY {
		p.writeStdinFor(a, []byte{4})
		return
	}
	p.mu.Lock()
	closed := p.stdinClosed
	p.stdinClosed = true
	p.mu.Unlock()
	if !closed {
		p.stdin.Close()
	}
}

func (p *process) resize(ws proto.WinSize) {
	if p.isPTY && ws.Rows > 0 && ws.Cols > 0 {
		pty.Setsize(p.stdin, &pty.Winsize{Rows: ws.Rows, Cols: ws.Cols})
	}
}

// finish records how the process ended, once its output ended too.
func (p *process) finish(exit proto.Exit) {
	p.mu.Lock()
	p.exit = &exit
	closeStdin := !p.stdinClosed && !p.isPTY && p.stdin != nil
	p.stdinClosed = true
	p.mu.Unlock()
	if closeStdin {
		p.stdin.Close()
	}
	p.out.close() // after exit is set: a reader at EOF finds it
}

// insert gives p its id and adds it to the table, or fails once the table
// is closed. On success the caller must call supervise.
func (t *procTable) insert(p *process) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("agent shutting down: %w", errkind.Unavailable)
	}
	t.lastID++
	p.id = t.lastID
	t.procs[p.id] = p
	t.wg.Add(1) // under mu, so never after close's Wait began
	return nil
}

func (t *procTable) get(id int64) (*process, error) {
	t.mu.Lock()
	p, ok := t.procs[id]
	t.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("process %d: %w", id, errNoProcess)
	}
	return p, nil
}

// list returns the table's processes ordered by id.
func (t *procTable) list() []*process {
	t.mu.Lock()
	ps := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *process) int { return cmp.Compare(a.id, b.id) })
	return ps
}

// finished records that p exited and forgets the oldest exited processes
// beyond maxExited.
func (t *procTable) finished(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[p.id] != p {
		return
	}
	if p.unlisted {
		delete(t.procs, p.id)
		return
	}
	t.exited = append(t.exited, p.id)
	for len(t.exited) > t.maxExited {
		delete(t.procs, t.exited[0])
		t.exited = t.exited[1:]
	}
}

// close refuses new processes and kills the running ones. Their goroutines
// end shortly after; wait waits for them.
func (t *procTable) close() {
	t.mu.Lock()
	t.closed = true
	ps := make([]*process, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	for _, p := range ps {
		p.kill(unix.SIGKILL)
	}
}

func (t *procTable) wait() { t.wg.Wait() }

// supervise runs a started process to its end: it pumps its outputs into
// the log, applies the timeout, waits for the leader, gives background
// children the exit grace to finish writing, and records the exit.
func (t *procTable) supervise(p *process, exited <-chan unix.WaitStatus, outputs []*os.File, types []proto.Type, timeout time.Duration) {
	defer t.wg.Done()
	var pumps sync.WaitGroup
	var leaderGone atomic.Bool
	for i, f := range outputs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer f.Close()
			pump(f, types[i], p.out, &leaderGone, t.grace)
		}()
	}
	var timer <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		timer = tm.C
	}
	var ws unix.WaitStatus
	timedOut := false
wait:
	for {
		select {
		case ws = <-exited:
			break wait
		case <-timer:
			timedOut = true
			p.kill(unix.SIGKILL)
			timer = nil
		}
	}
	p.markReaped()
	leaderGone.Store(true)
	// Wake pumps blocked in a read so they apply the exit grace.
	for _, f := range outputs {
		f.SetReadDeadline(time.Now().Add(t.grace))
	}
	pumps.Wait()
	exit := proto.Exit{Code: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		exit.Signal = int(ws.Signal())
		exit.Code = 128 + exit.Signal
	}
	p.finish(exit)
	t.finished(p)
	t.log.Debug("process exited", "id", p.id, "pid", p.pid, "code", exit.Code)
}

// pump copies one output of the process into its log until EOF. Once the
// leader has exited, it stops after grace without new bytes: children left
// in the background may hold the pipe open for ever. While an attachment
// holds the log and it is full, pump waits, and so does the process.
func pump(f *os.File, t proto.Type, out *outputLog, leaderGone *atomic.Bool, grace time.Duration) {
	// Reads as large as a chunk: when the host lags, output gathers in
	// the pipe and moves in few large pieces.
	buf := make([]byte, maxChunk)
	for {
		if leaderGone.Load() {
			f.SetReadDeadline(time.Now().Add(grace))
		}
		n, err := f.Read(buf)
		if n > 0 {
			out.write(t, buf[:n])
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !leaderGone.Load() {
				continue // the deadline was for an exit that had not happened
			}
			return // EOF, EIO from a pty whose last holder closed, or grace over
		}
	}
}

// endReason says why an attachment ended.
type endReason int

const (
	live         endReason = iota
	endExit                // the exit was delivered
	endHostGone            // the host closed the stream or went away
	endTakenOver           // a newer attachment replaced it
)

// attachment is one stream following a process: it receives the output and
// the exit, and sends stdin, signals and resizes.
type attachment struct {
	c    *call
	stop chan struct{} // closed when the attachment ends

	mu sync.Mutex
	// +checklocks:mu
	why endReason
}

func newAttachment(c *call) *attachment {
	return &attachment{c: c, stop: make(chan struct{})}
}

// end ends the attachment for why and reports whether this call ended it
// (the first reason wins).
func (a *attachment) end(why endReason) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.why != live {
		return false
	}
	a.why = why
	close(a.stop)
	return true
}

func (a *attachment) reason() endReason {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.why
}

// takeOver ends an attachment a newer one replaced. A send blocked on a
// host that does not read gives up after takeoverGrace.
func (a *attachment) takeOver() {
	if a.end(endTakenOver) {
		a.c.st.SetWriteDeadline(time.Now().Add(takeoverGrace))
	}
}
