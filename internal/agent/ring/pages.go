package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// A file the host reads can skip the guest's copy altogether: the agent
// pins the pages of the file's cache that hold a piece of it, tells the
// host where they lie in guest-physical memory (a PagesRef), and the host
// copies them out of the VM's memory file; then it gives the piece back
// and the agent unpins it. The guest only maps the pages and reads their
// frame numbers; the bytes never cross its CPU.

// PageSize is the unit the guest pins and the host copies in.
const PageSize = 4096

// MaxPiece is the most one PagesRef carries.
const MaxPiece = 2 << 20

// maxExtents bounds a PagesRef's extents: a MaxPiece piece that starts
// inside a page spans one page more, and no page is split.
const maxExtents = MaxPiece/PageSize + 1

// Extent is a run of bytes at consecutive guest-physical addresses.
type Extent struct {
	GPA uint64
	Len uint32
}

// PagesRef stands for Len bytes of type Type that lie in guest memory, in
// the order of Extents. ID names the piece in the host's release.
type PagesRef struct {
	Type    byte
	ID      uint32
	Len     uint32
	Extents []Extent
}

// Append appends the encoding of p to b: type, ID, length and count of
// extents, then each extent's address and length (big endian).
func (p PagesRef) Append(b []byte) []byte {
	b = append(b, p.Type)
	b = binary.BigEndian.AppendUint32(b, p.ID)
	b = binary.BigEndian.AppendUint32(b, p.Len)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.Extents)))
	for _, e := range p.Extents {
		b = binary.BigEndian.AppendUint64(b, e.GPA)
		b = binary.BigEndian.AppendUint32(b, e.Len)
	}
	return b
}

// ParsePagesRef decodes a pages reference frame's payload. It checks the
// shape only (lengths add up, at most MaxPiece bytes); whether the
// addresses are guest RAM is for MemoryFile.ReadGuest to say.
func ParsePagesRef(b []byte) (PagesRef, error) {
	bad := func(why string, args ...any) (PagesRef, error) {
		return PagesRef{}, fmt.Errorf("pages reference: %s: %w", fmt.Sprintf(why, args...), errkind.InvalidArgument)
	}
	if len(b) < 13 {
		return bad("%d bytes", len(b))
	}
	p := PagesRef{Type: b[0], ID: binary.BigEndian.Uint32(b[1:]), Len: binary.BigEndian.Uint32(b[5:])}
	n := binary.BigEndian.Uint32(b[9:])
	b = b[13:]
	if n == 0 || n > maxExtents || uint64(len(b)) != uint64(n)*12 {
		return bad("%d extents in %d bytes", n, len(b))
	}
	if p.Len == 0 || p.Len > MaxPiece {
		return bad("%d bytes", p.Len)
	}
	var sum uint64
	p.Extents = make([]Extent, n)
	for i := range p.Extents {
		e := Extent{GPA: binary.BigEndian.Uint64(b), Len: binary.BigEndian.Uint32(b[8:])}
		if e.Len == 0 || e.GPA+uint64(e.Len) < e.GPA {
			return bad("extent %d at %#x of %d bytes", i, e.GPA, e.Len)
		}
		sum += uint64(e.Len)
		p.Extents[i] = e
		b = b[12:]
	}
	if sum != uint64(p.Len) {
		return bad("extents of %d bytes for %d", sum, p.Len)
	}
	return p, nil
}

// FilePages pins pieces of files' page cache in the guest and finds their
// guest-physical addresses. It needs root: the frame numbers in
// /proc/self/pagemap are zero without CAP_SYS_ADMIN, and a pipe the size
// of a piece is above the unprivileged limit. It is safe for concurrent
// use.
type FilePages struct {
	pagemap *os.File
	null    *os.File // takes drained page references
	piece   int      // the most one pin holds: what a pipe holds here

	mu sync.Mutex
	// +checklocks:mu
	pipes [][2]int // empty pipes of MaxPiece bytes, for the next pins
}

// keepPipes is how many empty pipes FilePages keeps for reuse.
const keepPipes = 16

// OpenFilePages prepares pinning in this guest.
func OpenFilePages() (*FilePages, error) {
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, fmt.Errorf("pages: %w", err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		pm.Close()
		return nil, fmt.Errorf("pages: %w", err)
	}
	p := &FilePages{pagemap: pm, null: null, piece: MaxPiece}
	// A pipe above fs.pipe-max-size needs CAP_SYS_RESOURCE, which the
	// guest's agent has; elsewhere pieces are as large as a pipe may be.
	pipe, err := p.pipe()
	if errors.Is(err, unix.EPERM) {
		b, rerr := os.ReadFile("/proc/sys/fs/pipe-max-size")
		n, cerr := strconv.Atoi(strings.TrimSpace(string(b)))
		if rerr == nil && cerr == nil {
			p.piece = min(MaxPiece, n&^(PageSize-1))
		}
		pipe, err = p.pipe()
	}
	if err != nil {
		p.Close()
		return nil, err
	}
	p.drain(pipe, 0)
	return p, nil
}

// Piece is the most one Pin holds, a multiple of PageSize: MaxPiece where
// a pipe may be that large. A piece that ends on a multiple of Piece of
// its file always fits.
func (p *FilePages) Piece() int { return p.piece }

// Close closes the files FilePages keeps and the pipes it kept for reuse.
func (p *FilePages) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fds := range p.pipes {
		unix.Close(fds[0])
		unix.Close(fds[1])
	}
	p.pipes = nil
	p.null.Close()
	return p.pagemap.Close()
}

// Pin holds the pages of f's cache that hold its n bytes at off (n at
// most MaxPiece) and returns where those bytes lie, in order, and the
// unpin to call once the host has copied them.
//
// The pages are held by reference, the way a pipe holds spliced pages: a
// page with a reference is neither reclaimed nor moved, and one the file
// loses meanwhile (a truncation, a hole punched) lives on with the bytes
// it had until it is unpinned. So the host always copies bytes the file
// held, never memory reused for something else. Concretely: the piece is
// mapped and faulted in, vmsplice hands its pages to a pipe (taking a
// reference on each), pagemap gives their frames, and the mapping goes;
// unpin drains the pipe, which drops the references.
func (p *FilePages) Pin(f *os.File, off int64, n int) (_ []Extent, unpin func(), err error) {
	start := off &^ (PageSize - 1)
	skip := int(off - start)
	size := (skip + n + PageSize - 1) &^ (PageSize - 1)
	if off < 0 || n <= 0 || size > p.piece {
		return nil, nil, fmt.Errorf("pin %d bytes at %d: more than a piece of %d, or none: %w", n, off, p.piece, errkind.InvalidArgument)
	}
	mem, err := unix.Mmap(int(f.Fd()), start, size, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("pin: map: %w", err)
	}
	defer unix.Munmap(mem)
	pipe, err := p.pipe()
	if err != nil {
		return nil, nil, err
	}
	release := func() { p.drain(pipe, size) }
	defer func() {
		if err != nil {
			release()
		}
	}()
	iov := []unix.Iovec{{Base: &mem[0]}}
	iov[0].SetLen(size)
	if m, err := unix.Vmsplice(pipe[1], iov, unix.SPLICE_F_NONBLOCK); err != nil || m != size {
		return nil, nil, fmt.Errorf("pin: vmsplice took %d of %d bytes: %v: %w", m, size, err, errkind.FailedPrecondition)
	}
	pages := size / PageSize
	entries := make([]byte, 8*pages)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if _, err := p.pagemap.ReadAt(entries, int64(base/PageSize*8)); err != nil {
		return nil, nil, fmt.Errorf("pin: pagemap: %w", err)
	}
	var out []Extent
	for i := range pages {
		// Present here means the page the pipe holds: nothing faults
		// this mapping in again, and a held page is not moved.
		v := binary.LittleEndian.Uint64(entries[8*i:])
		pfn := v & (1<<55 - 1)
		if v&(1<<63) == 0 || pfn == 0 {
			return nil, nil, fmt.Errorf("pin: page %d of the piece has no frame (pagemap %#x): %w", i, v, errkind.FailedPrecondition)
		}
		// The piece's bytes in this page.
		lo, hi := max(skip-i*PageSize, 0), min(skip+n-i*PageSize, PageSize)
		gpa := pfn*PageSize + uint64(lo)
		if k := len(out) - 1; k >= 0 && out[k].GPA+uint64(out[k].Len) == gpa {
			out[k].Len += uint32(hi - lo)
		} else {
			out = append(out, Extent{GPA: gpa, Len: uint32(hi - lo)})
		}
	}
	return out, release, nil
}

// pipe returns an empty pipe that holds a piece.
func (p *FilePages) pipe() ([2]int, error) {
	p.mu.Lock()
	if n := len(p.pipes); n > 0 {
		fds := p.pipes[n-1]
		p.pipes = p.pipes[:n-1]
		p.mu.Unlock()
		return fds, nil
	}
	p.mu.Unlock()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return fds, fmt.Errorf("pin: pipe: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, p.piece); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fds, fmt.Errorf("pin: pipe of %d bytes: %w", p.piece, err)
	}
	return fds, nil
}

// drain drops the n bytes of page references in pipe (splicing them to
// /dev/null copies nothing) and keeps the pipe for reuse, or closes it.
func (p *FilePages) drain(pipe [2]int, n int) {
	for n > 0 {
		m, err := unix.Splice(pipe[0], nil, int(p.null.Fd()), nil, n, unix.SPLICE_F_NONBLOCK)
		if err != nil || m <= 0 {
			break
		}
		n -= int(m)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > 0 || len(p.pipes) >= keepPipes {
		unix.Close(pipe[0]) // closing drops what is left
		unix.Close(pipe[1])
		return
	}
	p.pipes = append(p.pipes, pipe)
}

// MemoryFile reads a VM's RAM through its memory file, at guest-physical
// addresses a guest named. It is safe for concurrent use.
type MemoryFile struct {
	f *os.File
	m GuestMemory
}

// OpenMemory opens the VM's memory file for reading.
func OpenMemory(m GuestMemory) (*MemoryFile, error) {
	f, err := os.Open(m.Path)
	if err != nil {
		return nil, fmt.Errorf("guest memory: %w", err)
	}
	return &MemoryFile{f: f, m: m}, nil
}

// ReadGuest fills dst with the guest's RAM at gpa. Addresses outside the
// VM's RAM are refused: the guest chooses them.
func (mf *MemoryFile) ReadGuest(dst []byte, gpa uint64) error {
	off, ok := mf.m.offset(gpa, uint64(len(dst)))
	if !ok {
		return fmt.Errorf("guest memory at %#x, %d bytes: not in the VM's RAM: %w", gpa, len(dst), errkind.InvalidArgument)
	}
	if _, err := mf.f.ReadAt(dst, off); err != nil {
		return fmt.Errorf("guest memory at %#x: %w", gpa, err)
	}
	return nil
}

// Close closes the memory file.
func (mf *MemoryFile) Close() error { return mf.f.Close() }
