package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

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
	go func() {
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
	// The attachment is over. The control reader goes on, without
	// applying anything, until the host closes its side: stdin frames the
	// host sent meanwhile may name ring slots, and each must be given back.
	// The call returns without waiting for it.
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

// stdinItem is input for a process, in the order the host sent it: the
// bytes of a stdin frame, or of a ring slot to give back once written
// (slot >= 0), or the input's end.
type stdinItem struct {
	data []byte
	slot int
	eof  bool
}

// stdinQueue is how many input frames an attachment holds between the
// stream and the process. The control reader goes on reading (signals,
// resizes, the host closing the stream) while a write waits on a process
// that does not read; only a full queue stops it. The host keeps at most
// a few ring references of input in flight, so those alone never fill it.
const stdinQueue = 8

// readControl applies the host's frames to the process until the stream
// ends, queueing input for writeInput, which starts with the first input
// (most calls send none). Once the attachment ended (the exit was sent, or
// another host took over) it applies nothing and only gives back the ring
// slots that stdin references name.
func (s *Server) readControl(p *process, a *attachment) {
	var in chan stdinItem
	defer func() {
		if in != nil {
			close(in)
		}
	}()
	queue := func(it stdinItem) {
		if in == nil {
			in = make(chan stdinItem, stdinQueue)
			go s.writeInput(p, a, in)
		}
		in <- it
	}
	for {
		f, err := a.c.r.Next()
		if err != nil {
			return
		}
		if a.reason() != live {
			if f.Type == proto.TypeDataRef {
				if slot, _, err := a.c.sess.view(f, proto.TypeStdin); err == nil {
					a.c.sess.release(slot)
				}
			}
			continue
		}
		switch f.Type {
		case proto.TypeStdin:
			queue(stdinItem{data: bytes.Clone(f.Payload), slot: -1})
		case proto.TypeDataRef:
			// A reference that does not check out is ignored, as any
			// misplaced frame is.
			if slot, data, err := a.c.sess.view(f, proto.TypeStdin); err == nil {
				queue(stdinItem{data: data, slot: slot})
			}
		case proto.TypeStdinEOF:
			queue(stdinItem{eof: true, slot: -1})
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

// writeInput writes the queued input to the process until in closes,
// giving back each ring slot once its bytes are written. Once a ended,
// queued input is dropped (its slots given back), and a write under way
// gives up.
func (s *Server) writeInput(p *process, a *attachment, in <-chan stdinItem) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-a.stop:
			p.abortStdin(a)
		case <-done:
		}
	}()
	for it := range in {
		switch {
		case it.eof:
			if a.reason() == live {
				p.closeStdinFor(a)
			}
		case len(it.data) > 0:
			p.writeStdinFor(a, it.data)
		}
		if it.slot >= 0 {
			a.c.sess.release(it.slot) // fails only as the session ends, which frees every slot
		}
	}
}
