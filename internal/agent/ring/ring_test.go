package ring

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"space/internal/errkind"
)

func TestNewRefusesBadSizes(t *testing.T) {
	for _, n := range []int{0, SlotSize, 3 * SlotSize, MinSize + 1} {
		if _, err := New(make([]byte, n), Host); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("New(%d bytes) = %v, want invalid argument", n, err)
		}
	}
}

func TestSlots(t *testing.T) {
	mem := make([]byte, 4*SlotSize)
	host, err := New(mem, Host)
	if err != nil {
		t.Fatal(err)
	}
	guest, err := New(mem, Guest)
	if err != nil {
		t.Fatal(err)
	}
	hs := host.Begin()
	slot, buf, err := hs.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	copy(buf, "from the host")
	// The guest sees the host's slot in its receiving half.
	if got, err := guest.View(slot, 13); err != nil || string(got) != "from the host" {
		t.Errorf("guest View = %q, %v", got, err)
	}
	if _, err := guest.View(2, 1); err == nil {
		t.Errorf("View(slot 2 of 2) = nil error")
	}
	if _, err := guest.View(0, SlotSize+1); err == nil {
		t.Errorf("View(more than a slot) = nil error")
	}
	released := false
	hs.Sent(slot, func() { released = true })
	hs.Release(slot + 1) // not sent: ignored
	if host.FreeSlots() != 1 {
		t.Errorf("FreeSlots = %d after a stray release, want 1", host.FreeSlots())
	}
	hs.Release(slot)
	if !released || host.FreeSlots() != 2 {
		t.Errorf("after release: hook ran %v, %d free, want true, 2", released, host.FreeSlots())
	}
	hs.Release(slot) // twice: ignored
	if host.FreeSlots() != 2 {
		t.Errorf("FreeSlots = %d after a double release, want 2", host.FreeSlots())
	}

	// A full half makes Acquire wait until ctx ends, or the session ends.
	a, _, _ := hs.Acquire(t.Context())
	b, _, _ := hs.Acquire(t.Context())
	hs.Sent(a, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := hs.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire on a full half = %v, want deadline exceeded", err)
	}
	done := make(chan error, 1)
	go func() { _, _, err := hs.Acquire(t.Context()); done <- err }()
	hs.End() // frees a (sent), not b (still being filled)
	if err := <-done; err == nil {
		t.Errorf("Acquire after End = nil error")
	}
	if host.FreeSlots() != 1 {
		t.Errorf("FreeSlots after End = %d, want 1 (the unsent slot stays its writer's)", host.FreeSlots())
	}
	hs.Sent(b, nil) // after End: back to the free list at once
	if host.FreeSlots() != 2 {
		t.Errorf("FreeSlots after a late Sent = %d, want 2", host.FreeSlots())
	}
	// A new session on the same region works.
	if _, _, err := host.Begin().Acquire(t.Context()); err != nil {
		t.Errorf("Acquire in a new session = %v", err)
	}
}

func TestRefAndRelease(t *testing.T) {
	r := Ref{Type: 8, Slot: 7, Len: 12345}
	got, err := ParseRef(r.Append(nil))
	if err != nil || got != r {
		t.Errorf("ParseRef(Append(%+v)) = %+v, %v", r, got, err)
	}
	if _, err := ParseRef([]byte{1, 2}); err == nil {
		t.Errorf("ParseRef(2 bytes) = nil error")
	}
	slots, err := ParseRelease(AppendRelease(nil, 1, 5, 9))
	if err != nil || len(slots) != 3 || slots[2] != 9 {
		t.Errorf("ParseRelease = %v, %v", slots, err)
	}
	if _, err := ParseRelease([]byte{1, 2, 3}); err == nil {
		t.Errorf("ParseRelease(3 bytes) = nil error")
	}
}

// TestSharedOpen maps chunks of a memory file as a VM's RAM: the host
// sees what is written at their offsets, chunks outside the RAM are
// refused, and the same chunks give the same region.
func TestSharedOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "memory")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const ram = 16 << 20
	if err := f.Truncate(ram); err != nil {
		t.Fatal(err)
	}
	// Chunk 0 at guest 6 MiB, chunk 1 at guest 2 MiB; guest RAM from 1 MiB
	// lies at file offset 0 (an offset layout, to test the translation).
	m := GuestMemory{Path: path, Ranges: []MemRange{{GPA: 1 << 20, Offset: 0, Size: ram}}}
	f.WriteAt([]byte("chunk0"), 5<<20)
	f.WriteAt([]byte("chunk1"), 1<<20)
	f.Close()
	sh := NewShared()
	r, release, err := sh.Open(m, []uint64{6 << 20, 2 << 20})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	// The host receives from the first half: chunk 0.
	if got, _ := r.View(0, 6); string(got) != "chunk0" {
		t.Errorf("first half starts %q, want chunk0", got)
	}
	if got := r.mem[ChunkSize : ChunkSize+6]; !bytes.Equal(got, []byte("chunk1")) {
		t.Errorf("second half starts %q, want chunk1", got)
	}
	r2, release2, err := sh.Open(m, []uint64{6 << 20, 2 << 20})
	if err != nil || r2 != r {
		t.Fatalf("second Open = %p, %v, want the same region %p", r2, err, r)
	}
	// Unmapped only once both let go; copies fail from then on.
	release()
	release() // a second call is a no-op
	if err := r.CopyIn(0, []byte("x")); err != nil {
		t.Errorf("CopyIn with one user left = %v", err)
	}
	release2()
	if err := r.CopyIn(0, []byte("x")); !errors.Is(err, ErrUnmapped) {
		t.Errorf("CopyIn after the last release = %v, want ErrUnmapped", err)
	}
	if _, err := r.CopyOut(0, 1, make([]byte, 1)); !errors.Is(err, ErrUnmapped) {
		t.Errorf("CopyOut after the last release = %v, want ErrUnmapped", err)
	}
	for _, chunks := range [][]uint64{
		{0, 2 << 20},         // below the RAM
		{6 << 20, ram},       // runs past its end
		{6<<20 + 1, 2 << 20}, // not page aligned
		{},                   // nothing
	} {
		if _, _, err := sh.Open(m, chunks); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Open(%#x) = %v, want invalid argument", chunks, err)
		}
	}
}

// TestTryAcquire: a slot only while more than keep are free, never waiting,
// and none once the session ended.
func TestTryAcquire(t *testing.T) {
	r, err := New(make([]byte, 8*SlotSize), Host) // 4 slots a half
	if err != nil {
		t.Fatal(err)
	}
	s := r.Begin()
	var got []int
	for {
		slot, ok := s.TryAcquire(2)
		if !ok {
			break
		}
		got = append(got, slot)
	}
	if len(got) != 2 || r.FreeSlots() != 2 {
		t.Fatalf("TryAcquire(keep 2) took %d slots, left %d free; want 2 and 2", len(got), r.FreeSlots())
	}
	if _, ok := s.TryAcquire(0); !ok {
		t.Errorf("TryAcquire(keep 0) with 2 free = false")
	}
	for _, slot := range got {
		s.Abandon(slot)
	}
	s.End()
	if _, ok := s.TryAcquire(0); ok {
		t.Errorf("TryAcquire after End = true")
	}
}
