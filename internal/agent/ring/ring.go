// Package ring moves bulk bytes between the host and the guest agent
// through a memory region both map, so that a transfer costs the guest one
// copy per byte instead of a trip through its virtio console.
//
// The region is guest RAM: the agent reserves locked huge pages and tells
// the host their guest-physical addresses (AllocGuest), and the host maps
// the same bytes from the VM's memory file (Shared). Its first half carries guest→host bytes, its second half host→guest bytes.
// Each half is cut into slots of SlotSize bytes. A sender takes a free slot
// of its own half, fills it, and sends a small frame on the agent session
// naming the slot and length (proto.TypeDataRef); the receiver copies the
// bytes out and gives the slot back with a release frame on the session's
// ring stream. Control stays on the session; only the payload moves
// through memory.
//
// Nothing the peer writes in the region or says about it is trusted: a
// slot index or length out of bounds is a protocol error, releases of slots
// that are not the peer's to release are ignored, and the bytes in a slot
// are only ever copied, never interpreted. A malicious guest can therefore
// corrupt only bytes that it sends or receives itself.
//
// A Region outlives sessions: the slots a session sent and the peer never
// released return to the free list when the session ends (End), while a
// slot still being filled by a writer of an ended session stays its
// writer's until the writer lets go, so it never carries two transfers.
package ring

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

	"space/internal/errkind"
)

// SlotSize is the size of one slot: the most one reference frame carries.
const SlotSize = 256 << 10

// MinPayload is the smallest payload worth a slot: smaller ones go inline
// on the session, where a reference and a release would cost more than the
// bytes.
const MinPayload = 16 << 10

// MinSize is the smallest region: one slot per direction.
const MinSize = 2 * SlotSize

// Side says which half of a region a party sends from.
type Side int

const (
	// Host sends from the second half and receives from the first.
	Host Side = iota
	// Guest sends from the first half and receives from the second.
	Guest
)

// Region is a mapped ring region seen from one side. It is safe for
// concurrent use.
type Region struct {
	mem   []byte
	slots int // per half
	tx    int // +checklocksignore: offset of this side's sending half; immutable
	rx    int // offset of the peer's sending half

	// mapMu guards the mapping itself: CopyIn and CopyOut hold it shared
	// while they touch mem, unmap holds it exclusively. The guest never
	// unmaps its region.
	mapMu sync.RWMutex
	// +checklocks:mapMu
	unmapped bool

	mu   sync.Mutex
	cond *sync.Cond // +checklocksignore: on mu, signalled when a slot was freed; immutable
	// +checklocks:mu
	free []int // free slots of the sending half
	// +checklocks:mu
	owner []*Session // the session a sent slot waits on, or nil
}

// New returns the region over mem as side sees it. len(mem) must be an
// even multiple of SlotSize of at least MinSize. mem stays the caller's
// (to unmap after the last use).
func New(mem []byte, side Side) (*Region, error) {
	if len(mem) < MinSize || len(mem)%(2*SlotSize) != 0 {
		return nil, fmt.Errorf("ring region of %d bytes: want a multiple of %d: %w", len(mem), 2*SlotSize, errkind.InvalidArgument)
	}
	half := len(mem) / 2
	r := &Region{mem: mem, slots: half / SlotSize}
	if side == Host {
		r.tx, r.rx = half, 0
	} else {
		r.tx, r.rx = 0, half
	}
	r.cond = sync.NewCond(&r.mu)
	r.mu.Lock()
	r.owner = make([]*Session, r.slots)
	for i := r.slots - 1; i >= 0; i-- {
		r.free = append(r.free, i)
	}
	r.mu.Unlock()
	return r, nil
}

// Size is the region's size in bytes.
func (r *Region) Size() int { return len(r.mem) }

// FreeSlots is how many slots of the sending half are free now.
func (r *Region) FreeSlots() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.free)
}

// Slots is the number of slots per direction.
func (r *Region) Slots() int { return r.slots }

// Session is one agent session's use of a region. Each side makes one per
// session with Begin and ends it with End.
type Session struct {
	r *Region

	mu sync.Mutex
	// +checklocks:mu
	ended bool
	// +checklocks:mu
	sent map[int]func() // slots sent and not yet released → their release hooks
}

// Begin starts a session on r.
func (r *Region) Begin() *Session {
	return &Session{r: r, sent: map[int]func(){}}
}

// Region returns the session's region.
func (s *Session) Region() *Region { return s.r }

// Acquire waits for a free slot of the sending half and returns it with
// its memory, or fails when ctx ends or the session ended. The caller owns
// the slot until it either passes it to Sent or gives it back with Abandon.
func (s *Session) Acquire(ctx context.Context) (int, []byte, error) {
	r := s.r
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.free) == 0 {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		if s.isEnded() {
			return 0, nil, errEnded
		}
		r.cond.Wait()
	}
	if s.isEnded() {
		return 0, nil, errEnded
	}
	slot, mem := r.take()
	return slot, mem, nil
}

// TryAcquire is Acquire without the wait, for senders that have another
// way to go: it takes a free slot only while more than keep slots are
// free, leaving those to transfers that need the ring, and reports false
// otherwise or once the session ended. Fill the slot with CopyIn.
func (s *Session) TryAcquire(keep int) (int, bool) {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.free) <= max(keep, 0) || s.isEnded() {
		return 0, false
	}
	slot, _ := r.take()
	return slot, true
}

// take removes a slot from the free list, which must not be empty.
//
// +checklocks:r.mu
func (r *Region) take() (int, []byte) {
	slot := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	off := r.tx + slot*SlotSize
	return slot, r.mem[off : off+SlotSize : off+SlotSize]
}

// errEnded is returned by Acquire once the session ended.
var errEnded = fmt.Errorf("ring session ended: %w", errkind.Unavailable) // +checklocksignore: immutable

func (s *Session) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// Abandon returns a slot that was acquired and not sent.
func (s *Session) Abandon(slot int) { s.r.putFree(slot) }

// putFree returns slots to the free list and wakes Acquire.
func (r *Region) putFree(slots ...int) {
	if len(slots) == 0 {
		return
	}
	r.mu.Lock()
	r.free = append(r.free, slots...)
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Sent records that the slot was referenced in a frame to the peer: it
// is free again once the peer releases it, or once the session ends.
// onRelease, if not nil, runs then (outside any lock). Sent must come
// before the frame goes out, so a quick release finds the slot.
func (s *Session) Sent(slot int, onRelease func()) {
	if onRelease == nil {
		onRelease = func() {}
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		s.Abandon(slot)
		onRelease()
		return
	}
	s.sent[slot] = onRelease
	s.mu.Unlock()
}

// Unsent undoes Sent for a slot whose frame could not be sent.
func (s *Session) Unsent(slot int) {
	s.mu.Lock()
	hook, ok := s.sent[slot]
	delete(s.sent, slot)
	s.mu.Unlock()
	if ok {
		s.Abandon(slot)
		hook()
	}
}

// Release frees slots the peer says it is done with. Slots this session
// did not send are ignored.
func (s *Session) Release(slots ...int) {
	var hooks []func()
	var freed []int
	s.mu.Lock()
	for _, slot := range slots {
		if hook, ok := s.sent[slot]; ok {
			delete(s.sent, slot)
			hooks = append(hooks, hook)
			freed = append(freed, slot)
		}
	}
	s.mu.Unlock()
	s.r.putFree(freed...)
	for _, h := range hooks {
		h()
	}
}

// End ends the session: slots it sent and the peer never released are
// free again, and Acquire fails from now on.
func (s *Session) End() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	sent := s.sent
	s.sent = nil
	s.mu.Unlock()
	slots := make([]int, 0, len(sent))
	for slot := range sent {
		slots = append(slots, slot)
	}
	s.r.putFree(slots...)
	for _, h := range sent {
		h()
	}
}

// View returns the n bytes the peer put in its slot, checking both against
// the region. The bytes stay the peer's to change: copy them out, then
// release the slot.
func (r *Region) View(slot, n int) ([]byte, error) {
	if slot < 0 || slot >= r.slots || n < 0 || n > SlotSize {
		return nil, fmt.Errorf("ring reference to slot %d, %d bytes (%d slots of %d): %w", slot, n, r.slots, SlotSize, errkind.InvalidArgument)
	}
	off := r.rx + slot*SlotSize
	return r.mem[off : off+n : off+n], nil
}

// ErrUnmapped is returned by CopyIn and CopyOut once the host's region
// was unmapped (its last user let go of it).
var ErrUnmapped = fmt.Errorf("ring unmapped: %w", errkind.Unavailable)

// CopyOut copies the n bytes the peer put in its slot into dst (which
// must hold n) and returns them, checking both against the region.
func (r *Region) CopyOut(slot, n int, dst []byte) ([]byte, error) {
	r.mapMu.RLock()
	defer r.mapMu.RUnlock()
	if r.unmapped {
		return nil, ErrUnmapped
	}
	b, err := r.View(slot, n)
	if err != nil {
		return nil, err
	}
	return dst[:copy(dst[:n], b)], nil
}

// CopyIn copies src into a slot of this side's sending half.
func (r *Region) CopyIn(slot int, src []byte) error {
	if slot < 0 || slot >= r.slots || len(src) > SlotSize {
		return fmt.Errorf("ring write of %d bytes to slot %d: %w", len(src), slot, errkind.InvalidArgument)
	}
	r.mapMu.RLock()
	defer r.mapMu.RUnlock()
	if r.unmapped {
		return ErrUnmapped
	}
	copy(r.mem[r.tx+slot*SlotSize:], src)
	return nil
}

// unmap unmaps the region once no copy is under way; later copies fail.
func (r *Region) unmap(munmap func([]byte) error) error {
	r.mapMu.Lock()
	defer r.mapMu.Unlock()
	if r.unmapped {
		return nil
	}
	r.unmapped = true
	return munmap(r.mem)
}

// Ref is a reference frame's payload: the frame type the bytes stand for
// (data, stdout or stderr), the slot and the length.
type Ref struct {
	Type byte
	Slot uint32
	Len  uint32
}

// RefLen is the encoded size of a Ref.
const RefLen = 9

// Append appends the encoding of f to b.
func (f Ref) Append(b []byte) []byte {
	b = append(b, f.Type)
	b = binary.BigEndian.AppendUint32(b, f.Slot)
	return binary.BigEndian.AppendUint32(b, f.Len)
}

// ParseRef decodes a reference frame's payload.
func ParseRef(p []byte) (Ref, error) {
	if len(p) != RefLen {
		return Ref{}, fmt.Errorf("ring reference of %d bytes, want %d: %w", len(p), RefLen, errkind.InvalidArgument)
	}
	return Ref{Type: p[0], Slot: binary.BigEndian.Uint32(p[1:]), Len: binary.BigEndian.Uint32(p[5:])}, nil
}

// AppendRelease appends the encoding of released slots (a release frame's
// payload) to b.
func AppendRelease(b []byte, slots ...int) []byte {
	for _, s := range slots {
		b = binary.BigEndian.AppendUint32(b, uint32(s))
	}
	return b
}

// ParseRelease decodes a release frame's payload. Indexes out of range
// come back as they are; Session.Release ignores them.
func ParseRelease(p []byte) ([]int, error) {
	if len(p)%4 != 0 {
		return nil, fmt.Errorf("ring release of %d bytes: %w", len(p), errkind.InvalidArgument)
	}
	out := make([]int, 0, len(p)/4)
	for i := 0; i < len(p); i += 4 {
		out = append(out, int(binary.BigEndian.Uint32(p[i:])))
	}
	return out, nil
}
