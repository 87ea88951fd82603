package server

import (
	"fmt"
	"os"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// Pinner pins a piece of a file's page cache in guest memory and says
// where it lies (ring.FilePages): the host then copies the bytes in place.
type Pinner interface {
	// Pin pins n bytes of f at off, a piece that ends on a multiple of
	// Piece or at the end of the file.
	Pin(f *os.File, off int64, n int) (_ []ring.Extent, unpin func(), err error)
	// Piece is the most one Pin holds, at most ring.MaxPiece.
	Piece() int
}

// minPagesRead is the least of a file worth sending as page references:
// below it, pinning costs more than the copy into a slot it saves.
const minPagesRead = 1 << 20

// maxPinned is how many pieces a read keeps pinned while the host copies
// them: enough to keep both sides busy.
const maxPinned = 4

// sendPages sends the bytes of f from off, up to end, as page references
// while it can, and returns the offset it got to: the caller sends the
// rest by copying (a file that shrank, a piece that could not be pinned).
// It returns an error only when the call cannot go on.
func (s *Server) sendPages(c *call, f *os.File, off, end int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return off, nil
	}
	end = min(end, fi.Size())
	pinned := map[uint32]func(){}
	defer func() {
		for _, unpin := range pinned {
			unpin()
		}
	}()
	var id uint32
	for off < end {
		if len(pinned) == maxPinned {
			if err := c.awaitPagesRelease(pinned); err != nil {
				return off, err
			}
			continue
		}
		// Pieces end on multiples of the piece size in the file.
		piece := int64(s.cfg.Pages.Piece())
		n := int(min(end-off, piece-off%piece))
		ext, unpin, err := s.cfg.Pages.Pin(f, off, n)
		if err != nil {
			s.log.Debug("pin failed; copying instead", "err", err)
			break
		}
		id++
		pinned[id] = unpin
		ref := ring.PagesRef{Type: byte(proto.TypeData), ID: id, Len: uint32(n), Extents: ext}
		if err := c.send(proto.TypePagesRef, ref.Append(nil)); err != nil {
			return off, err
		}
		off += int64(n)
	}
	for len(pinned) > 0 {
		if err := c.awaitPagesRelease(pinned); err != nil {
			return off, err
		}
	}
	return off, nil
}

// awaitPagesRelease waits for the host to give back one or more pinned
// pieces and unpins them. Any other frame, or the stream's end, ends the
// call: the host no longer copies.
func (c *call) awaitPagesRelease(pinned map[uint32]func()) error {
	f, err := c.r.Next()
	if err != nil {
		return errHostGone
	}
	if f.Type != proto.TypeRelease {
		return fmt.Errorf("%s frame during a file read: %w", f.Type, errkind.InvalidArgument)
	}
	ids, err := ring.ParseRelease(f.Payload)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if unpin, ok := pinned[uint32(id)]; ok {
			unpin()
			delete(pinned, uint32(id))
		}
	}
	return nil
}
