package client

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
)

// Option tunes Dial.
type Option func(*options)

type options struct {
	ring   RingOpener
	memory *ring.GuestMemory
}

// RingOpener maps the ring an agent offers: the guest-physical addresses
// of its chunks, in the VM's memory (ring.Shared.Open). It is given
// guest-chosen addresses and must refuse any outside the VM's RAM. The
// client calls release once, when it is closed.
type RingOpener func(chunks []uint64) (r *ring.Region, release func(), err error)

// WithRing has the client move bulk bytes through the agent's ring,
// mapped with open, when the agent offers one; otherwise they go inline.
func WithRing(open RingOpener) Option { return func(o *options) { o.ring = open } }

// WithGuestMemory lets the client copy file reads straight from the
// guest's page cache, reading the VM's RAM through its memory file m,
// when the agent offers that (proto.RingFeatures.PageRefs). It takes
// effect only with a ring (WithRing).
func WithGuestMemory(m ring.GuestMemory) Option { return func(o *options) { o.memory = &m } }

// attachRing attaches the session to the agent's ring (proto.OpRing). A
// guest without one, an agent without the op, or an offer that does not
// check out leaves the client without a ring and no error: the ring only
// makes transfers faster.
func (c *Client) attachRing(ctx context.Context, open RingOpener) error {
	s, release, err := c.open(context.WithoutCancel(ctx), proto.OpRing, proto.Empty{})
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, release)
	defer stop()
	fail := func(err error) error {
		release()
		if ctx.Err() != nil || c.sess.IsClosed() {
			return c.callErr(ctx, proto.OpRing, err)
		}
		return nil // no ring here: inline it is
	}
	f, err := s.r.Next()
	if err != nil {
		return fail(err)
	}
	var offer proto.RingOffer
	if err := decodeResult(proto.OpRing, f, 0, &offer); err != nil {
		return fail(err)
	}
	r, unmap, err := open(offer.Chunks)
	if err != nil {
		return fail(err)
	}
	attached := false
	defer func() {
		if !attached {
			unmap()
		}
	}()
	token, err := hex.DecodeString(offer.Token)
	if err != nil || len(token) < 16 || len(token) > 64 || int64(r.Size()) != offer.Size {
		return fail(protocolErr(proto.OpRing, "bad offer"))
	}
	got, err := r.CopyOut(offer.Slot, len(token), make([]byte, len(token)))
	if err != nil || !bytes.Equal(got, token) {
		return fail(protocolErr(proto.OpRing, "token not in the offered memory"))
	}
	if err := s.write(proto.TypeRelease, ring.AppendRelease(nil, offer.Slot)); err != nil {
		return fail(err)
	}
	if f, err = s.r.Next(); err == nil {
		err = decodeResult(proto.OpRing, f, 0, &proto.Empty{})
	}
	if err != nil {
		return fail(err)
	}
	rs := r.Begin()
	c.ring, c.ringStream, c.ringUnmap = rs, s, unmap
	attached = true
	go c.readReleases(rs, s, release)
	return nil
}

// readReleases applies the guest's releases until the session ends, then
// ends the ring session.
func (c *Client) readReleases(rs *ring.Session, s *stream, release func()) {
	defer rs.End()
	defer release()
	for {
		f, err := s.r.Next()
		if err != nil {
			return
		}
		if f.Type == proto.TypeResult {
			// Leniently: a later agent says more than this host knows.
			var feat proto.RingFeatures
			if json.Unmarshal(f.Payload, &feat) == nil {
				c.stdinRefs.Store(feat.StdinRefs)
				c.pageRefs.Store(feat.PageRefs)
			}
			continue
		}
		if f.Type != proto.TypeRelease {
			continue
		}
		slots, err := ring.ParseRelease(f.Payload)
		if err != nil {
			c.sess.Close() // the agent broke the protocol
			return
		}
		rs.Release(slots...)
	}
}

// Ring reports whether bulk bytes move through a ring on this connection.
func (c *Client) Ring() bool { return c.ring != nil }

// RingStdin reports whether process input moves through the ring too: the
// agent said it takes it, shortly after the ring was attached.
func (c *Client) RingStdin() bool { return c.ring != nil && c.stdinRefs.Load() }

// PageReads reports whether file reads may come as page references,
// which the client copies from the VM's memory: the agent offers them and
// the client can read that memory (WithGuestMemory).
func (c *Client) PageReads() bool { return c.memory != nil && c.pageRefs.Load() }

// copyPages writes to w the bytes a pages reference names, copied from
// the guest's memory, then gives the piece back to the agent on s. It
// returns how many bytes it wrote.
func (c *Client) copyPages(ctx context.Context, op proto.Op, s *stream, f proto.Frame, w io.Writer, limit int64) (int, error) {
	ref, err := ring.ParsePagesRef(f.Payload)
	if err != nil {
		return 0, protocolErr(op, "%v", err)
	}
	if proto.Type(ref.Type) != proto.TypeData {
		return 0, protocolErr(op, "pages reference to %s bytes", proto.Type(ref.Type))
	}
	if int64(ref.Len) > limit {
		return 0, protocolErr(op, "pages reference of %d bytes, more than the %d allowed", ref.Len, limit)
	}
	buf := pageBufs.Get().(*[]byte)
	defer pageBufs.Put(buf)
	b, at := (*buf)[:ref.Len], 0
	for _, e := range ref.Extents {
		if err := c.memory.ReadGuest(b[at:at+int(e.Len)], e.GPA); err != nil {
			if c.sess.IsClosed() {
				return 0, fmt.Errorf("%s: %w", op, ErrClosed)
			}
			return 0, protocolErr(op, "%v", err)
		}
		at += int(e.Len)
	}
	// Release before writing, as with a slot: the agent unpins at once,
	// and a slow writer never holds the guest's pages. A release that
	// fails means the agent may have unpinned already: b is not sent on.
	if err := s.write(proto.TypeRelease, ring.AppendRelease(nil, int(ref.ID))); err != nil {
		return 0, c.callErr(ctx, op, err)
	}
	if _, err := w.Write(b); err != nil {
		return 0, fmt.Errorf("%s: write: %w", op, err)
	}
	return len(b), nil
}

// copyRef writes to w the bytes a reference frame names, checking they are
// of type want, then gives the slot back to the guest. It returns how many
// bytes it wrote.
func (c *Client) copyRef(op proto.Op, f proto.Frame, want proto.Type, w io.Writer, limit int64) (int, error) {
	if c.ring == nil {
		return 0, protocolErr(op, "%s frame without a ring", f.Type)
	}
	ref, err := ring.ParseRef(f.Payload)
	if err != nil {
		return 0, protocolErr(op, "%v", err)
	}
	if proto.Type(ref.Type) != want {
		return 0, protocolErr(op, "ring reference to %s bytes, want %s", proto.Type(ref.Type), want)
	}
	if int64(ref.Len) > limit {
		return 0, protocolErr(op, "ring reference of %d bytes, more than the %d allowed", ref.Len, limit)
	}
	// Copy out and release before writing: the slot goes back to the
	// guest at once, and a slow writer never holds the mapping.
	buf := slotBufs.Get().(*[]byte)
	defer slotBufs.Put(buf)
	b, err := c.ring.Region().CopyOut(int(ref.Slot), int(ref.Len), *buf)
	if errors.Is(err, ring.ErrUnmapped) {
		return 0, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if err != nil {
		return 0, protocolErr(op, "%v", err)
	}
	if err := c.ringStream.write(proto.TypeRelease, ring.AppendRelease(nil, int(ref.Slot))); err != nil {
		return 0, c.callErr(context.Background(), op, err)
	}
	var werr error
	if w != nil {
		_, werr = w.Write(b)
	}
	if werr != nil {
		return 0, fmt.Errorf("%s: write: %w", op, werr)
	}
	return len(b), nil
}

// sendFrom sends the bytes of r as data frames on s, through ring slots
// when the client has a ring, and returns at EOF (sending no end frame).
func (c *Client) sendFrom(ctx context.Context, op proto.Op, s *stream, r io.Reader) error {
	if c.ring == nil {
		buf := make([]byte, proto.DataChunk)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if err := s.write(proto.TypeData, buf[:n]); err != nil {
					return err
				}
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s: read source: %w", op, err)
			}
		}
	}
	rs := c.ring
	bufp := slotBufs.Get().(*[]byte)
	defer slotBufs.Put(bufp)
	buf := *bufp
	for {
		// Read the source into a buffer of our own first: a slow source
		// then holds neither a slot nor the mapping.
		n, rerr := fill(r, buf)
		var err error
		switch {
		case n == 0:
		case n < ring.MinPayload:
			err = s.write(proto.TypeData, buf[:n])
		default:
			var slot int
			if slot, _, err = rs.Acquire(ctx); err != nil {
				return err
			}
			err = c.sendRef(s, proto.TypeData, slot, buf[:n], nil)
		}
		if err != nil {
			return err
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			return fmt.Errorf("%s: read source: %w", op, rerr)
		}
	}
}

// sendRef fills slot, which the caller acquired, with b and sends it on s
// as a reference to bytes of type t; onRelease (if not nil) runs once the
// slot is free again. On error the slot is free again, and onRelease has
// run.
func (c *Client) sendRef(s *stream, t proto.Type, slot int, b []byte, onRelease func()) error {
	rs := c.ring
	if err := rs.Region().CopyIn(slot, b); err != nil {
		rs.Abandon(slot)
		if onRelease != nil {
			onRelease()
		}
		return err
	}
	rs.Sent(slot, onRelease)
	err := s.write(proto.TypeDataRef, ring.Ref{Type: byte(t), Slot: uint32(slot), Len: uint32(len(b))}.Append(nil))
	if err != nil {
		rs.Unsent(slot)
	}
	return err
}

// drain reads what is left of a call the caller gave up on, giving back
// the ring slots its frames name, until the agent ends the stream. The
// agent sends no more once it sees the host closed its side, and every
// slot it sent is released here, so giving up mid-transfer leaks none.
func (c *Client) drain(s *stream) {
	if c.ring == nil {
		return
	}
	go func() {
		for {
			f, err := s.r.Next()
			if err != nil {
				return
			}
			if f.Type != proto.TypeDataRef {
				continue
			}
			if ref, err := ring.ParseRef(f.Payload); err == nil {
				if c.ringStream.write(proto.TypeRelease, ring.AppendRelease(nil, int(ref.Slot))) != nil {
					return
				}
			}
		}
	}()
}

// fill reads from r until buf is full, r ends (io.EOF, with what it read)
// or r fails. Unlike io.ReadFull it keeps the source's own errors apart
// from its end: a body cut short (io.ErrUnexpectedEOF from an HTTP server)
// must fail the write, never commit a truncated file.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// pageReads bounds the reads in place under way in this process: each
// holds a buffer of a whole piece (pageBufs), eight times a slot, so many
// downloads at once would otherwise cost the host that much more memory.
var pageReads = make(chan struct{}, 16)

// pageBufs are the host's private buffers of a pages reference's size.
var pageBufs = sync.Pool{New: func() any { b := make([]byte, ring.MaxPiece); return &b }}

// slotBufs are the host's private buffers of a slot's size.
var slotBufs = sync.Pool{New: func() any { b := make([]byte, ring.SlotSize); return &b }}
