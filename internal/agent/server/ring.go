package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// session is one host session's state that its calls share.
type session struct {
	mu sync.Mutex
	// +checklocks:mu
	ring *ring.Session // or nil: no ring attached
	// +checklocks:mu
	ringCall *call // the OpRing stream, carrying releases
}

func (ss *session) ringSession() *ring.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.ring
}

// end ends the session's ring use: slots the host never released are free
// again.
func (ss *session) end() {
	ss.mu.Lock()
	rs := ss.ring
	ss.mu.Unlock()
	if rs != nil {
		rs.End()
	}
}

// release gives a host slot back once its bytes were copied out.
func (ss *session) release(slot int) error {
	ss.mu.Lock()
	rc := ss.ringCall
	ss.mu.Unlock()
	if rc == nil {
		return fmt.Errorf("release ring slot: no ring attached: %w", errkind.FailedPrecondition)
	}
	return rc.send(proto.TypeRelease, ring.AppendRelease(nil, slot))
}

// view returns the host's bytes a reference frame names.
func (ss *session) view(f proto.Frame, want proto.Type) (slot int, b []byte, err error) {
	rs := ss.ringSession()
	if rs == nil {
		return 0, nil, fmt.Errorf("%s frame without a ring: %w", f.Type, errkind.InvalidArgument)
	}
	ref, err := ring.ParseRef(f.Payload)
	if err != nil {
		return 0, nil, err
	}
	if proto.Type(ref.Type) != want {
		return 0, nil, fmt.Errorf("ring reference to %s bytes, want %s: %w", proto.Type(ref.Type), want, errkind.InvalidArgument)
	}
	b, err = rs.Region().View(int(ref.Slot), int(ref.Len))
	return int(ref.Slot), b, err
}

// ringAttach serves OpRing: it offers the ring's chunks with a token in a
// slot, and once the host accepts (releases that slot) attaches the
// session to the ring, then applies the host's releases until the stream
// ends.
func (s *Server) ringAttach(c *call) error {
	if s.cfg.Ring == nil {
		return c.fail(fmt.Errorf("no ring in this guest: %w", errkind.FailedPrecondition))
	}
	ss := c.sess
	ss.mu.Lock()
	attached := ss.ring != nil
	ss.mu.Unlock()
	if attached {
		return c.fail(fmt.Errorf("ring already attached: %w", errkind.Conflict))
	}
	rs := s.cfg.Ring.Begin()
	defer func() {
		ss.mu.Lock()
		mine := ss.ring == rs
		ss.mu.Unlock()
		if !mine {
			rs.End() // declined: the token slot is free again
		}
	}()
	slot, buf, err := rs.Acquire(context.Background())
	if err != nil {
		return c.fail(err)
	}
	var token [32]byte
	rand.Read(token[:])
	copy(buf, token[:])
	rs.Sent(slot, nil)
	offer := proto.RingOffer{Size: int64(s.cfg.Ring.Size()), Chunks: s.cfg.RingChunks, Slot: slot, Token: hex.EncodeToString(token[:])}
	if err := c.result(offer); err != nil {
		return err
	}
	accepted := false
	for {
		f, err := c.r.Next()
		if err != nil {
			return nil // the host closed the stream, or the session ended
		}
		if f.Type != proto.TypeRelease {
			continue
		}
		slots, err := ring.ParseRelease(f.Payload)
		if err != nil {
			return c.fail(err)
		}
		rs.Release(slots...)
		if !accepted {
			accepted = true
			ss.mu.Lock()
			ss.ring, ss.ringCall = rs, c
			ss.mu.Unlock()
			if err := c.result(proto.Empty{}); err != nil {
				return err
			}
			if err := c.result(proto.RingFeatures{StdinRefs: true, PageRefs: s.cfg.Pages != nil}); err != nil {
				return err
			}
		}
	}
}

// sendBulk sends n bytes of type t that fill writes into buf: through a
// ring slot when the session has a ring and n is worth it, inline
// otherwise. fill gets a buffer of at least n bytes and returns how many
// it wrote; 0 sends nothing.
func (c *call) sendBulk(ctx context.Context, t proto.Type, n int, inline []byte, fill func(buf []byte) (int, error)) (int, error) {
	rs := c.sess.ringSession()
	if rs == nil || n < ring.MinPayload {
		m, err := fill(inline[:min(n, len(inline))])
		if m > 0 {
			if serr := c.send(t, inline[:m]); serr != nil {
				return 0, serr
			}
		}
		return m, err
	}
	slot, buf, err := rs.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	m, err := fill(buf[:min(n, len(buf))])
	if m < ring.MinPayload {
		// Little came (a small file, a file's tail): inline is cheaper.
		var serr error
		if m > 0 {
			serr = c.send(t, buf[:m]) // copies: the slot is free after
		}
		rs.Abandon(slot)
		if serr != nil {
			return 0, serr
		}
		return m, err
	}
	rs.Sent(slot, nil)
	if serr := c.send(proto.TypeDataRef, ring.Ref{Type: byte(t), Slot: uint32(slot), Len: uint32(m)}.Append(nil)); serr != nil {
		rs.Unsent(slot)
		return 0, serr
	}
	return m, err
}

// drain reads the rest of a call the agent gave up on, giving back the
// ring slots the host's frames name, until the host's end frame or the
// stream's end.
func (c *call) drain() {
	if c.sess.ringSession() == nil {
		return
	}
	for {
		f, err := c.r.Next()
		if err != nil || f.Type == proto.TypeEnd {
			return
		}
		if f.Type != proto.TypeDataRef {
			continue
		}
		if ref, err := ring.ParseRef(f.Payload); err == nil {
			if c.sess.release(int(ref.Slot)) != nil {
				return
			}
		}
	}
}

// sendOutput sends a chunk of output: as one ring reference when the
// session has a ring and the chunk is worth it, else as data frames of at
// most proto.DataChunk.
func (c *call) sendOutput(ctx context.Context, t proto.Type, data []byte) error {
	if rs := c.sess.ringSession(); rs != nil && len(data) >= ring.MinPayload {
		_, err := c.sendBulk(ctx, t, len(data), nil, func(b []byte) (int, error) { return copy(b, data), nil })
		return err
	}
	for len(data) > 0 {
		n := min(len(data), proto.DataChunk)
		if err := c.send(t, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}
