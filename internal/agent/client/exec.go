package client

import (
	"context"
	"fmt"
	"io"
	"sync"

	"space/internal/agent/proto"
)

// IO connects a process to the caller. Nil members mean: no stdin (the
// process reads /dev/null unless Stdin is set) and discarded output.
// Writers are called from one goroutine each; a slow writer slows the
// process down (backpressure), it never makes the client buffer.
type IO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Process is a command started in the guest.
type Process struct {
	PID int // guest pid

	c       *Client
	s       *stream
	release func()
	op      proto.Op
	ctx     context.Context

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
	p := &Process{PID: started.PID, c: c, s: s, release: release, op: proto.OpExec, ctx: ctx,
		done: make(chan struct{}), stdinDone: make(chan struct{})}
	go p.readOutput(pio.Stdout, pio.Stderr)
	if pio.Stdin != nil {
		go p.copyStdin(pio.Stdin)
	} else {
		close(p.stdinDone)
	}
	return p, nil
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
	for {
		f, err := p.s.r.Next()
		if err != nil {
			p.err = p.c.callErr(p.ctx, p.op, err)
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
				p.err = fmt.Errorf("exec: write output: %w", err)
				return
			}
		case proto.TypeExit:
			if err := proto.DecodeJSON(f, 0, &p.exit); err != nil {
				p.err = protocolErr(p.op, "exit: %v", err)
			}
			return
		default:
			var v struct{}
			p.err = decodeResult(p.op, f, 0, &v)
			if p.err == nil {
				p.err = protocolErr(p.op, "unexpected result frame")
			}
			return
		}
	}
}

func (p *Process) copyStdin(r io.Reader) {
	defer close(p.stdinDone)
	buf := make([]byte, proto.DataChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if p.s.write(proto.TypeStdin, buf[:n]) != nil {
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

// Wait waits for the process to end and returns how it ended.
func (p *Process) Wait() (proto.Exit, error) {
	<-p.done
	p.release() // also unblocks a stdin copier waiting on the window
	if p.err == nil && p.ctx.Err() != nil {
		// The guest killed the process because the caller gave up.
		return p.exit, fmt.Errorf("%s: %w", p.op, context.Cause(p.ctx))
	}
	return p.exit, p.err
}

// Done is closed when the process has ended and its output is delivered.
func (p *Process) Done() <-chan struct{} { return p.done }
