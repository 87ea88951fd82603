package client_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/agent/server"
	"space/internal/agent/tarball"
)

// fakePinner stands in for ring.FilePages, which needs a guest: the host
// of a test cannot read the physical pages a real pin names. It copies
// each piece into a memory file that plays the guest's RAM, one area per
// pinned piece, with the piece's pages in reverse order so that a piece
// is several extents, and counts what is pinned.
type fakePinner struct {
	mem   *os.File // the "RAM"
	piece int

	mu sync.Mutex
	// +checklocks:mu
	free []int // free areas, by index
	// +checklocks:mu
	pinned int // pieces pinned now
	// +checklocks:mu
	pins int // pieces pinned ever
	// +checklocks:mu
	failAt int // fail the pin with this number (1-based); 0 = never
	// +checklocks:mu
	badSpace bool // name addresses outside the RAM
}

const fakeAreas = 8

func newFakePinner(t *testing.T, piece int) *fakePinner {
	t.Helper()
	fd, err := unix.MemfdCreate("ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("setup: memfd: %v", err)
	}
	mem := os.NewFile(uintptr(fd), "ram")
	t.Cleanup(func() { mem.Close() })
	if err := mem.Truncate(int64(fakeAreas * (piece + ring.PageSize))); err != nil {
		t.Fatalf("setup: %v", err)
	}
	p := &fakePinner{mem: mem, piece: piece}
	for i := range fakeAreas {
		p.free = append(p.free, i)
	}
	return p
}

func (p *fakePinner) memory() ring.GuestMemory {
	st, _ := p.mem.Stat()
	return ring.GuestMemory{Path: fmt.Sprintf("/proc/self/fd/%d", p.mem.Fd()), Ranges: []ring.MemRange{{GPA: 1 << 30, Offset: 0, Size: uint64(st.Size())}}}
}

func (p *fakePinner) Piece() int { return p.piece }

func (p *fakePinner) Pin(f *os.File, off int64, n int) ([]ring.Extent, func(), error) {
	p.mu.Lock()
	p.pins++
	if p.pins == p.failAt || len(p.free) == 0 {
		p.mu.Unlock()
		return nil, nil, errors.New("fake pin refused")
	}
	area := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.pinned++
	bad := p.badSpace
	p.mu.Unlock()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil, nil, err
	}
	base := uint64(1<<30) + uint64(area*(p.piece+ring.PageSize))
	if bad {
		base = 1 << 40
	}
	// Cut the piece at the file's page boundaries, and lay the pages
	// out last first.
	var ext []ring.Extent
	slot := (n + int(off%ring.PageSize) + ring.PageSize - 1) / ring.PageSize
	for at := 0; at < n; {
		k := min(n-at, ring.PageSize-int((off+int64(at))%ring.PageSize))
		slot--
		gpa := base + uint64(slot*ring.PageSize)
		if _, err := p.mem.WriteAt(buf[at:at+k], int64(gpa-base)+int64(area*(p.piece+ring.PageSize))); err != nil && !bad {
			return nil, nil, err
		}
		ext = append(ext, ring.Extent{GPA: gpa, Len: uint32(k)})
		at += k
	}
	return ext, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.pinned--
		p.free = append(p.free, area)
	}, nil
}

func (p *fakePinner) counts() (pinned, pins int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pinned, p.pins
}

// settled waits until no piece is pinned, and fails the test if one stays.
func (p *fakePinner) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pinned, _ := p.counts()
		if pinned == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pieces still pinned", pinned)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *fakePinner) set(failAt int, badSpace bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failAt, p.badSpace, p.pins = failAt, badSpace, 0
}

// TestAgentInProcessPagesFakePinner checks file reads as page references
// end to end between a real client and agent, with pins faked (see
// fakePinner): bytes, ranges, fallbacks, a host that gives up, and an
// agent naming memory outside the VM's RAM.
func TestAgentInProcessPagesFakePinner(t *testing.T) {
	host, guest := sharedRegions(t, 2*ring.ChunkSize)
	pin := newFakePinner(t, 1<<20)
	_, c := inProcessWith(t, server.Config{Version: "test", Ring: guest, RingChunks: []uint64{0, 2 << 20}, Pages: pin},
		client.WithRing(opener(t, host)), client.WithGuestMemory(pin.memory()))
	deadline := time.Now().Add(5 * time.Second)
	for !c.PageReads() {
		if time.Now().After(deadline) {
			t.Fatalf("the client never learnt that the agent sends page references")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx := t.Context()
	dir := t.TempDir()
	put := func(t *testing.T, n int) (string, []byte) {
		data := make([]byte, n)
		rand.Read(data)
		path := fmt.Sprintf("%s/f%d", dir, n)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path, data
	}

	t.Run("Bytes", func(t *testing.T) {
		for _, tt := range []struct {
			size, off, length int
			pinned            bool
		}{
			{size: 1<<20 - 1},
			{size: 1 << 20, pinned: true},
			{size: 2<<20 + 1, pinned: true},
			{size: 5<<20 + 77, pinned: true},
			{size: 5<<20 + 77, off: 4095, length: 3 << 20, pinned: true},
			{size: 5<<20 + 77, off: 1<<20 + 1, pinned: true},
			{size: 5<<20 + 77, off: 4<<20 + 78},
		} {
			pin.set(0, false)
			path, data := put(t, tt.size)
			var got bytes.Buffer
			info, err := c.ReadFileRange(ctx, proto.ReadArgs{Path: path, Offset: int64(tt.off), Length: int64(tt.length)}, &got)
			want := data[tt.off:]
			if tt.length > 0 {
				want = want[:tt.length]
			}
			if err != nil || !bytes.Equal(got.Bytes(), want) || info.Size != int64(len(want)) {
				t.Errorf("read %+v = %v, %d bytes, size %d: not the file's bytes", tt, err, got.Len(), info.Size)
			}
			if _, pins := pin.counts(); (pins > 0) != tt.pinned {
				t.Errorf("read %+v: %d pins, want pins %v", tt, pins, tt.pinned)
			}
			pin.settled(t)
		}
	})

	t.Run("Tar", func(t *testing.T) {
		pin.set(0, false)
		tree := t.TempDir()
		for i, n := range []int{10, 3<<20 + 5, 700, 1 << 20, 2 << 20} {
			data := make([]byte, n)
			rand.Read(data)
			if err := os.WriteFile(fmt.Sprintf("%s/f%d", tree, i), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var want, got bytes.Buffer
		if _, err := tarball.Pack(ctx, tree, &want); err != nil {
			t.Fatal(err)
		}
		if _, err := c.TarRead(ctx, tree, &got); err != nil || !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("TarRead = %v, %d bytes: not the archive Pack makes (%d bytes)", err, got.Len(), want.Len())
		}
		if _, pins := pin.counts(); pins != 4+1+2 {
			t.Errorf("%d pins, want 7: the three files of 1 MiB or more go in place, in pieces of 1 MiB", pins)
		}
		pin.settled(t)
	})

	t.Run("PinFailsThenCopies", func(t *testing.T) {
		pin.set(3, false)
		path, data := put(t, 6<<20+5)
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, path, &got); err != nil || !bytes.Equal(got.Bytes(), data) {
			t.Errorf("read with the third pin failing = %v, %d bytes: not the file's bytes", err, got.Len())
		}
		if _, pins := pin.counts(); pins != 3 {
			t.Errorf("%d pins, want 3: the read goes on by copying after a failed pin", pins)
		}
		pin.settled(t)
	})

	t.Run("HostGivesUp", func(t *testing.T) {
		pin.set(0, false)
		path, _ := put(t, 12<<20)
		_, err := c.ReadFile(ctx, path, &failingAfter{n: 1})
		if err == nil {
			t.Fatalf("read into a writer that fails = nil error")
		}
		pin.settled(t) // every pin given back though the host stopped copying
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, path, &got); err != nil || got.Len() != 12<<20 {
			t.Errorf("read after a given-up read = %v, %d bytes", err, got.Len())
		}
		pin.settled(t)
	})

	t.Run("AddressOutsideRAM", func(t *testing.T) {
		pin.set(0, true)
		path, _ := put(t, 3<<20)
		if _, err := c.ReadFile(ctx, path, &bytes.Buffer{}); err == nil {
			t.Errorf("read of pages outside the VM's RAM = nil error")
		}
		pin.settled(t)
	})
}

// failingAfter fails every write after its first n.
type failingAfter struct{ n int }

func (w *failingAfter) Write(p []byte) (int, error) {
	if w.n == 0 {
		return 0, errors.New("writer gave up")
	}
	w.n--
	return len(p), nil
}
