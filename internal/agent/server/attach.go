package server

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/errkind"
)

// procListBatch bounds the JSON of one proc.list batch; one ProcInfo alone
// stays well below proto.MaxFrame, since its request was at most
// proto.MaxControl.
const procListBatch = 256 << 10

func (s *Server) procStart(ctx context.Context, c *call, ps proto.ProcStart) error {
	var a *attachment
	if ps.Attach {
		a = newAttachment(c)
	}
	p, err := s.startProcess(ps, a)
	if err != nil {
		return c.fail(err)
	}
	if a == nil {
		return c.result(p.info())
	}
	return s.serveAttachment(ctx, p, a, func() error { return c.result(p.info()) })
}

func (s *Server) procAttach(ctx context.Context, c *call, ref proto.ProcRef) error {
	p, err := s.procs.get(ref.ID)
	if err != nil {
		return c.fail(err)
	}
	a := newAttachment(c)
	first := func() error { return c.result(p.info()) }
	if ref.Share {
		if o := p.join(a); o != nil {
			defer p.out.unobserve(o)
			return s.serveShared(ctx, p, a, o, first)
		}
	} else if old := p.attach(a); old != nil {
		old.takeOver()
	}
	return s.serveAttachment(ctx, p, a, first)
}

func (s *Server) procList(c *call) error {
	var batch proto.ProcList
	size := 0
	for _, p := range s.procs.list() {
		info := p.info()
		b, err := json.Marshal(info)
		if err != nil {
			return c.fail(fmt.Errorf("encode process %d: %w", p.id, err))
		}
		if size+len(b) > procListBatch && len(batch.Processes) > 0 {
			if err := c.result(batch); err != nil {
				return err
			}
			batch, size = proto.ProcList{}, 0
		}
		batch.Processes = append(batch.Processes, info)
		size += len(b) + 1
	}
	if len(batch.Processes) > 0 {
		if err := c.result(batch); err != nil {
			return err
		}
	}
	return c.send(proto.TypeEnd, nil)
}

func (s *Server) procSignal(a proto.ProcSignal) error {
	if a.Signal < 1 || a.Signal > 64 {
		return fmt.Errorf("signal process %d: signal %d: %w", a.ID, a.Signal, errkind.InvalidArgument)
	}
	p, err := s.procs.get(a.ID)
	if err != nil {
		return err
	}
	p.kill(unix.Signal(a.Signal))
	return nil
}

// serveAttachment serves attachment a of p on its stream: first sends the
// first frame (a result or Started), then the output not yet delivered,
// live output and the exit, while a second goroutine applies the host's
// frames. It returns when the exit was sent, the host went away or a newer
// attachment took over.
func (s *Server) serveAttachment(ctx context.Context, p *process, a *attachment, first func() error) error {
	return s.serveShared(ctx, p, a, nil, first)
}

// serveShared is serveAttachment for a shared attachment that reads
// through observer o, or, with o nil, for the process's attachment.
func (s *Server) serveShared(ctx context.Context, p *process, a *attachment, o *observer, first func() error) error {
	c := a.c
	stop := context.AfterFunc(ctx, func() { s.hostGone(p, a) })
	defer stop()
	ctlDone := make(chan struct{})
	go func() {
		defer close(ctlDone)
		s.readControl(p, a)
		s.hostGone(p, a) // a no-op when the attachment ended otherwise
	}()
	err := first()
	if err != nil {
		s.hostGone(p, a)
	} else {
		err = s.deliver(p, a, o)
	}
	if a.reason() == endTakenOver {
		err = c.fail(fmt.Errorf("process %d: %w", p.id, errTakenOver))
	}
	// The attachment is over: end the control reader without waiting for
	// the host to close its side.
	c.st.SetReadDeadline(time.Now())
	<-ctlDone
	return err
}

// deliver sends p's output to a until the exit is sent or a ends: through
// observer o, or with o nil through the delivery cursor. Each chunk leaves
// the log only once it was sent.
func (s *Server) deliver(p *process, a *attachment, o *observer) error {
	if o == nil {
		if !p.out.acquire(a.stop) {
			return nil
		}
		defer p.out.release()
	}
	// A wait for a ring slot ends with the attachment.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-a.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		ch, ok := p.out.nextAt(o, a.stop)
		if !ok {
			return nil
		}
		if ch.eof {
			exit, _ := p.exitStatus() // set before the log closed
			if err := a.c.sendJSON(proto.TypeExit, exit); err != nil {
				s.hostGone(p, a)
				return err
			}
			if a.end(endExit) {
				p.detach(a)
			}
			return nil
		}
		if err := a.c.sendOutput(ctx, ch.typ, ch.data); err != nil {
			s.hostGone(p, a)
			return err
		}
		p.out.advanceAt(o, ch.end)
	}
}

// hostGone ends a because its host closed the stream or went away: p is
// detached, and killed if it asked for that.
func (s *Server) hostGone(p *process, a *attachment) {
	if !a.end(endHostGone) {
		return
	}
	kill := p.detach(a) && p.killOnDetach
	if kill {
		p.kill(unix.SIGKILL)
	}
	// Wake a send blocked on a window the host will never open.
	a.c.st.Close()
	s.log.Debug("process detached", "id", p.id, "killed", kill)
}

// readControl applies the host's frames to the process until the stream
// ends or the attachment does.
func (s *Server) readControl(p *process, a *attachment) {
	for {
		f, err := a.c.r.Next()
		if err != nil {
			return
		}
		if a.reason() != live {
			return // taken over: frames for the process come from the new host
		}
		switch f.Type {
		case proto.TypeStdin:
			p.writeStdin(f.Payload)
		case proto.TypeStdinEOF:
			p.closeStdin()
		case proto.TypeSignal:
			var sig proto.Signal
			if proto.DecodeJSON(f, 0, &sig) == nil && sig.Signal > 0 && sig.Signal < 65 {
				p.kill(unix.Signal(sig.Signal))
			}
		case proto.TypeResize:
			var ws proto.WinSize
			if proto.DecodeJSON(f, 0, &ws) == nil {
				p.resize(ws)
			}
		default:
			// Unknown or misplaced frames are ignored: the call goes on.
		}
	}
}
