package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// ErrDetached is returned by Process.Wait when the attachment ended before
// the exit arrived: Detach was called, the ctx ended, a newer attachment
// took over (the error then also wraps errkind.FailedPrecondition) or the
// connection was lost. Unless the process was started with KillOnDetach,
// it goes on in the guest; Attach follows it again.
var ErrDetached = fmt.Errorf("detached from process: %w", errkind.Unavailable)

// IO connects a process to the caller. Nil members mean: no stdin (the
// process reads /dev/null unless Stdin is set) and discarded output.
// Writers are called from one goroutine each; a slow writer slows the
// process down (backpressure), it never makes the client buffer.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Process is a command running in the guest, followed over one stream: one
// started by Start, or an attachment to a process of the agent's table
// (StartAttached, Attach).
type Process struct {
	PID int   // guest pid
	ID  int64 // id in the agent's process table; 0 for Start

	c        *Client
	s        *stream
	release  func()
	op       proto.Op
	ctx      context.Context
	table    bool        // an attachment to a process of the agent's table
	detached atomic.Bool // Detach was called

	done chan struct{} // closed when the output loop ends
	exit proto.Exit    // set before done closes
	err  error         // set before done closes

	stdinOnce sync.Once
	stdinDone chan struct{}
}

// Start starts a process and returns once it runs. The process stops when
// ctx ends (the guest kills its process group). Call Wait.
func (c *Client) Start(ctx context.Context, req proto.ExecRequest, pio IO) (*Process, error) {
	if pio.Stdin != nil {
		req.Stdin = true
	}
	s, release, err := c.open(ctx, proto.OpExec, req)
	if err != nil {
		return nil, err
	}
	f, err := s.r.Next()
	if err != nil {
		release()
		return nil, c.callErr(ctx, proto.OpExec, err)
	}
	var started proto.Started
	if err := decodeStarted(f, &started); err != nil {
		release()
		return nil, err
	}
	p := &Process{PID: started.PID, c: c, s: s, release: release, op: proto.OpExec, ctx: ctx}
	p.run(pio)
	return p, nil
}

// run starts the goroutines that serve the process's IO.
func (p *Process) run(pio IO) {
	p.done, p.stdinDone = make(chan struct{}), make(chan struct{})
	go p.readOutput(pio.Stdout, pio.Stderr)
	if pio.Stdin != nil {
		go p.copyStdin(pio.Stdin)
	} else {
		close(p.stdinDone)
	}
}

// StartProcess starts a process in the agent's process table and returns
// once it runs, without following it: the process outlives ctx and the
// connection. ps.Attach is ignored; follow the process with Attach, or use
// StartAttached. Output is buffered in the guest up to
// proto.ProcOutputLimit bytes; beyond that, while nobody is attached, the
// oldest output is dropped.
func (c *Client) StartProcess(ctx context.Context, ps proto.ProcStart) (proto.ProcInfo, error) {
	ps.Attach = false
	var info proto.ProcInfo
	if err := proto.CheckProcTag(ps.Tag); err != nil {
		return info, err // JSON would have mangled some of it
	}
	s, release, err := c.open(ctx, proto.OpProcStart, ps)
	if err != nil {
		return info, err
	}
	defer release()
	f, err := s.r.Next()
	if err != nil {
		return info, c.callErr(ctx, proto.OpProcStart, err)
	}
	if err = decodeResult(proto.OpProcStart, f, proto.MaxFrame, &info); err != nil {
		return info, err
	}
	return info, c.checkTag(ps, info)
}

// checkTag kills a process started with a tag that the agent did not keep
// (it predates tags): untagged, it could not be found by its tag.
func (c *Client) checkTag(ps proto.ProcStart, info proto.ProcInfo) error {
	if info.Tag == ps.Tag {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.SignalProcess(ctx, info.ID, 9) // SIGKILL, as the guest numbers it
	return fmt.Errorf("process tag %.64q: the sandbox's agent (version %s) predates process tags; the process was killed (rebuild the template for a newer agent): %w",
		ps.Tag, c.agentVersion, errkind.FailedPrecondition)
}

// StartAttached starts a process in the agent's process table and follows
// it on the same call, from its first byte of output. Setting pio.Stdin sets
// ps.Stdin. When ctx ends or Detach is called, the process is detached: it
// goes on in the guest unless ps.KillOnDetach is set.
func (c *Client) StartAttached(ctx context.Context, ps proto.ProcStart, pio IO) (*Process, proto.ProcInfo, error) {
	ps.Attach = true
	if pio.Stdin != nil {
		ps.Stdin = true
	}
	if err := proto.CheckProcTag(ps.Tag); err != nil {
		return nil, proto.ProcInfo{}, err
	}
	p, info, err := c.attach(ctx, proto.OpProcStart, ps, pio)
	if err == nil {
		if err = c.checkTag(ps, info); err != nil {
			p.Detach()
			p = nil
		}
	}
	return p, info, err
}

// Attach follows a process of the agent's table: it receives the output
// buffered and not yet delivered to an earlier attachment, then live output
// and the exit. An earlier attachment is taken over (its Wait returns
// ErrDetached). pio.Stdin reaches the process only if it was started with
// Stdin or a PTY. When ctx ends or Detach is called, the process is
// detached (or killed, if it was started with KillOnDetach). An unknown id
// gives an errkind.NotFound error.
func (c *Client) Attach(ctx context.Context, id int64, pio IO) (*Process, proto.ProcInfo, error) {
	return c.attach(ctx, proto.OpProcAttach, proto.ProcRef{ID: id}, pio)
}

// AttachShared follows a process alongside its live attachment instead of
// taking over: it receives the output written from now on and the exit,
// while the other attachment keeps receiving everything too. A process
// with no live attachment is attached as by Attach. Ending a shared
// attachment never kills the process. Agents that predate sharing take
// over instead.
func (c *Client) AttachShared(ctx context.Context, id int64, pio IO) (*Process, proto.ProcInfo, error) {
	return c.attach(ctx, proto.OpProcAttach, proto.ProcRef{ID: id, Share: true}, pio)
}

func (c *Client) attach(ctx context.Context, op proto.Op, args any, pio IO) (*Process, proto.ProcInfo, error) {
	var info proto.ProcInfo
	s, release, err := c.open(ctx, op, args)
	if err != nil {
		return nil, info, err
	}
	f, err := s.r.Next()
	if err != nil {
		release()
		return nil, info, c.callErr(ctx, op, err)
	}
	if err := decodeResult(op, f, proto.MaxFrame, &info); err != nil {
		release()
		return nil, info, err
	}
	p := &Process{PID: info.PID, ID: info.ID, c: c, s: s, release: release, op: op, ctx: ctx, table: true}
	p.run(pio)
	return p, info, nil
}

// Processes lists the agent's process table, ordered by id: running
// processes and the most recent proto.ProcMaxExited exited ones.
func (c *Client) Processes(ctx context.Context) ([]proto.ProcInfo, error) {
	op := proto.OpProcList
	ctx, cancel := unaryCtx(ctx)
	defer cancel()
	s, release, err := c.open(ctx, op, proto.Empty{})
	if err != nil {
		return nil, err
	}
	defer release()
	defer s.readUntil(ctx)()
	var out []proto.ProcInfo
	for {
		f, err := s.r.Next()
		if err != nil {
			return nil, c.callErr(ctx, op, err)
		}
		if f.Type == proto.TypeEnd {
			return out, nil
		}
		var b proto.ProcList
		if err := decodeResult(op, f, proto.MaxFrame, &b); err != nil {
			return nil, err
		}
		out = append(out, b.Processes...)
		if len(out) > maxListEntries {
			return nil, protocolErr(op, "more than %d processes", maxListEntries)
		}
	}
}

// SignalProcess sends sig to the process group of a process of the agent's
// table; it does nothing once the process has exited. An unknown id gives
// an errkind.NotFound error.
func (c *Client) SignalProcess(ctx context.Context, id int64, sig int) error {
	return c.simple(ctx, proto.OpProcSignal, proto.ProcSignal{ID: id, Signal: sig}, &proto.Empty{})
}

// ProcessInput writes to the stdin of a process of the agent's table,
// closes it, or resizes its terminal (proto.OpProcInput), without
// attaching. An agent older than the op gives an errkind.FailedPrecondition
// error saying so.
func (c *Client) ProcessInput(ctx context.Context, in proto.ProcInput) error {
	op := proto.OpProcInput
	switch {
	case len(in.Data) > proto.MaxProcInput:
		return fmt.Errorf("%s: %d bytes, more than %d: %w", op, len(in.Data), proto.MaxProcInput, errkind.InvalidArgument)
	case in.Resize != nil && (in.Resize.Rows == 0 || in.Resize.Cols == 0):
		return fmt.Errorf("%s: terminal size %dx%d: %w", op, in.Resize.Cols, in.Resize.Rows, errkind.InvalidArgument)
	case in.Resize != nil && (len(in.Data) > 0 || in.EOF):
		return fmt.Errorf("%s: a resize goes alone: %w", op, errkind.InvalidArgument)
	}
	err := c.simple(ctx, op, in, &proto.Empty{})
	// The arguments are valid, so invalid_argument means the agent did not
	// know the op.
	if errors.Is(err, errkind.InvalidArgument) {
		return fmt.Errorf("agent %q does not support input without attaching (built before it): %v: %w",
			c.agentVersion, err, errkind.FailedPrecondition)
	}
	return err
}

func decodeStarted(f proto.Frame, v *proto.Started) error {
	if f.Type == proto.TypeStarted {
		if err := proto.DecodeJSON(f, 0, v); err != nil {
			return protocolErr(proto.OpExec, "started: %v", err)
		}
		return nil
	}
	return decodeResult(proto.OpExec, f, 0, v) // an error frame, or a protocol error
}

// Exec runs a process to completion and returns how it ended.
func (c *Client) Exec(ctx context.Context, req proto.ExecRequest, pio IO) (proto.Exit, error) {
	p, err := c.Start(ctx, req, pio)
	if err != nil {
		return proto.Exit{}, err
	}
	return p.Wait()
}

func (p *Process) readOutput(stdout, stderr io.Writer) {
	defer close(p.done)
	ended := false
	defer func() {
		if !ended {
			p.c.drain(p.s)
		}
	}()
	for {
		f, err := p.s.r.Next()
		if err != nil {
			ended = true
			p.err = p.endErr(p.c.callErr(p.ctx, p.op, err))
			return
		}
		switch f.Type {
		case proto.TypeStdout, proto.TypeStderr:
			w := stdout
			if f.Type == proto.TypeStderr {
				w = stderr
			}
			if w == nil {
				continue
			}
			if _, err := w.Write(f.Payload); err != nil {
				p.err = p.endErr(fmt.Errorf("%s: write output: %w", p.op, err))
				return
			}
		case proto.TypeDataRef:
			ref, err := ring.ParseRef(f.Payload)
			if err != nil {
				p.err = protocolErr(p.op, "%v", err)
				return
			}
			w, want := stdout, proto.TypeStdout
			if proto.Type(ref.Type) == proto.TypeStderr {
				w, want = stderr, proto.TypeStderr
			}
			if _, err := p.c.copyRef(p.op, f, want, w, ring.SlotSize); err != nil {
				p.err = p.endErr(err)
				return
			}
		case proto.TypeExit:
			if err := proto.DecodeJSON(f, 0, &p.exit); err != nil {
				p.err = protocolErr(p.op, "exit: %v", err)
			}
			return
		default:
			var v struct{}
			err := decodeResult(p.op, f, 0, &v)
			if err == nil {
				err = protocolErr(p.op, "unexpected result frame")
			} else {
				err = p.endErr(err) // taken over
			}
			p.err = err
			return
		}
	}
}

func (p *Process) copyStdin(r io.Reader) {
	defer close(p.stdinDone)
	var refs chan struct{} // one token per stdin slot in flight
	var buf []byte
	if p.c.RingStdin() {
		refs = make(chan struct{}, stdinRefsInFlight)
		bufp := slotBufs.Get().(*[]byte)
		defer slotBufs.Put(bufp)
		buf = *bufp
	} else {
		buf = make([]byte, proto.DataChunk)
	}
	for {
		// One read, not a fill: input typed at a terminal goes at once.
		n, err := r.Read(buf)
		if n > 0 {
			if p.sendStdin(buf[:n], refs) != nil {
				return
			}
		}
		if err != nil {
			// EOF or a failed reader: either way the process sees the end.
			p.CloseStdin()
			return
		}
	}
}

// stdinRefsInFlight bounds the ring slots one process's input holds: a
// process that stops reading its stdin keeps at most these from the
// transfers that share the ring.
const stdinRefsInFlight = 2

// stdinKeepFree is how many free slots stdin leaves to other transfers:
// with fewer free, its bytes go inline.
const stdinKeepFree = 2

// sendStdin sends b as the process's input: through a ring slot when refs
// is not nil, b is worth a slot and one is free, inline otherwise. Waiting
// for a token of refs is the back-pressure a full stream window gives
// inline bytes.
func (p *Process) sendStdin(b []byte, refs chan struct{}) error {
	if refs != nil && len(b) >= ring.MinPayload {
		select {
		case refs <- struct{}{}:
		case <-p.done:
			return ErrClosed // the process ended: its input has nowhere to go
		}
		if slot, ok := p.c.ring.TryAcquire(stdinKeepFree); ok {
			return p.c.sendRef(p.s, proto.TypeStdin, slot, b, func() { <-refs })
		}
		<-refs
	}
	return p.WriteStdin(b)
}

// endErr explains why the stream ended before the exit. For a process of
// the agent's table, that is a detach: the process may go on.
func (p *Process) endErr(err error) error {
	switch {
	case !p.table:
		return err
	case p.detached.Load():
		return fmt.Errorf("process %d: %w", p.ID, ErrDetached)
	case errors.Is(err, errkind.Internal):
		return err // the agent broke the protocol
	}
	return fmt.Errorf("process %d: %w: %w", p.ID, ErrDetached, err)
}

// Detach stops following the process and closes its stream; Wait then
// returns ErrDetached. A process of the agent's table goes on in the guest
// unless it was started with KillOnDetach; a process from Start is killed.
func (p *Process) Detach() {
	p.detached.Store(true)
	p.release()
}

// CloseStdin tells the process its input ended (^D on a terminal).
func (p *Process) CloseStdin() error {
	var err error
	p.stdinOnce.Do(func() { err = p.s.write(proto.TypeStdinEOF, nil) })
	return err
}

// WriteStdin sends bytes to the process's stdin (or terminal). Use it only
// when Start was given no IO.Stdin but req.Stdin or req.PTY was set.
func (p *Process) WriteStdin(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), proto.DataChunk)
		if err := p.s.write(proto.TypeStdin, b[:n]); err != nil {
			return fmt.Errorf("exec: stdin: %w", err)
		}
		b = b[n:]
	}
	return nil
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig int) error {
	return p.s.writeJSON(proto.TypeSignal, proto.Signal{Signal: sig})
}

// Resize changes the terminal size of a PTY process.
func (p *Process) Resize(rows, cols uint16) error {
	return p.s.writeJSON(proto.TypeResize, proto.WinSize{Rows: rows, Cols: cols})
}

// Wait waits for the process to end and returns how it ended. For an
// attachment to a process of the agent's table, an error wrapping
// ErrDetached means the attachment ended first.
func (p *Process) Wait() (proto.Exit, error) {
	<-p.done
	p.release() // also unblocks a stdin copier waiting on the window
	if p.err == nil && p.ctx.Err() != nil && !p.table {
		// The guest killed the process because the caller gave up.
		return p.exit, fmt.Errorf("%s: %w", p.op, context.Cause(p.ctx))
	}
	return p.exit, p.err
}

// Done is closed when the process has ended and its output is delivered,
// or the attachment ended.
func (p *Process) Done() <-chan struct{} { return p.done }
