package ring

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// ChunkSize is the unit of guest memory a region is made of: one huge
// page, physically contiguous and never moved by the guest kernel.
const ChunkSize = 2 << 20

// DefaultSize is the region a guest agent sets aside: 16 slots, 8 each
// way, in two huge pages of its RAM.
const DefaultSize = 2 * ChunkSize

// AllocGuest sets aside size bytes of the guest's own RAM for a region
// (a multiple of ChunkSize): it reserves huge pages, maps them locked, and
// returns their memory and guest-physical addresses, one per chunk. The
// host reaches the same bytes through the VM's memory file. It needs root
// (pagemap shows physical frames only to CAP_SYS_ADMIN) and huge page
// support in the guest kernel.
func AllocGuest(size int) (mem []byte, chunks []uint64, err error) {
	if size < ChunkSize || size%ChunkSize != 0 || size%(2*SlotSize) != 0 {
		return nil, nil, fmt.Errorf("ring of %d bytes: want a multiple of %d: %w", size, ChunkSize, errkind.InvalidArgument)
	}
	if err := reserveHugePages(size / ChunkSize); err != nil {
		return nil, nil, err
	}
	mem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE|unix.MAP_LOCKED)
	if err != nil {
		return nil, nil, fmt.Errorf("map huge pages for the ring: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Munmap(mem)
		}
	}()
	for i := range mem { // touch every page: it must be present to have a frame
		if i%4096 == 0 {
			mem[i] = 0
		}
	}
	pm, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, nil, fmt.Errorf("ring: %w", err)
	}
	defer pm.Close()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	for off := 0; off < size; off += ChunkSize {
		var e [8]byte
		if _, err := pm.ReadAt(e[:], int64((base+uintptr(off))/4096*8)); err != nil {
			return nil, nil, fmt.Errorf("ring: pagemap: %w", err)
		}
		v := binary.LittleEndian.Uint64(e[:])
		pfn := v & (1<<55 - 1)
		if v&(1<<63) == 0 || pfn == 0 {
			return nil, nil, fmt.Errorf("ring: no physical frame for a huge page (pagemap %#x): %w", v, errkind.FailedPrecondition)
		}
		chunks = append(chunks, pfn*4096)
	}
	return mem, chunks, nil
}

// reserveHugePages makes sure the guest has n more free 2 MiB huge pages.
func reserveHugePages(n int) error {
	const nr = "/proc/sys/vm/nr_hugepages"
	b, err := os.ReadFile(nr)
	if err != nil {
		return fmt.Errorf("ring: huge pages: %w", err)
	}
	have, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := os.WriteFile(nr, []byte(strconv.Itoa(have+n)), 0); err != nil {
		return fmt.Errorf("ring: reserve huge pages: %w", err)
	}
	return nil
}

// MemRange is a piece of a VM's guest-physical memory and where it lies
// in the VM's memory file.
type MemRange struct {
	GPA    uint64 `json:"gpa"`
	Offset int64  `json:"offset"`
	Size   uint64 `json:"size"`
}

// GuestMemory is a VM's memory file and its layout: what the host needs
// to reach a ring in the guest's RAM.
type GuestMemory struct {
	Path   string     `json:"path"`
	Ranges []MemRange `json:"ranges"`
}

// offset returns where the n bytes at guest-physical address gpa lie in
// the memory file, or false when they are not all inside one range.
func (m GuestMemory) offset(gpa, n uint64) (int64, bool) {
	for _, r := range m.Ranges {
		if gpa >= r.GPA && gpa-r.GPA <= r.Size && n <= r.Size-(gpa-r.GPA) {
			return r.Offset + int64(gpa-r.GPA), true
		}
	}
	return 0, false
}

// Shared keeps one host Region per VM ring, so every connection to a VM's
// agent, including a reconnect while an older one winds down, takes slots
// from the same allocator. Open counts users; the region is unmapped when
// the last one calls its release, after any copy under way (the host only
// touches a region through CopyIn and CopyOut, which fail from then on).
// So a VM's memory file is mapped only while a connection uses it, and a
// stopped VM's storage can be unmounted. It is safe for concurrent use.
type Shared struct {
	mu sync.Mutex
	// +checklocks:mu
	regions map[regionKey]*shared
}

type shared struct {
	r    *Region
	refs int
}

type regionKey struct {
	dev, ino uint64
	chunks   string
}

// NewShared returns an empty set of shared regions.
func NewShared() *Shared { return &Shared{regions: map[regionKey]*shared{}} }

// Open returns the host's Region over the guest RAM at chunks (guest-
// physical addresses of ChunkSize pieces, as the agent offered them),
// mapping it from the VM's memory file on first use, and the release the
// caller must call once when done with it. Chunks outside the VM's RAM are
// refused: the agent chooses them.
func (sh *Shared) Open(m GuestMemory, chunks []uint64) (*Region, func(), error) {
	if len(chunks) == 0 || len(chunks)*ChunkSize%(2*SlotSize) != 0 || len(chunks) > 64 {
		return nil, nil, fmt.Errorf("ring of %d chunks: %w", len(chunks), errkind.InvalidArgument)
	}
	offsets := make([]int64, len(chunks))
	for i, gpa := range chunks {
		off, ok := m.offset(gpa, ChunkSize)
		if !ok || gpa%4096 != 0 {
			return nil, nil, fmt.Errorf("ring chunk at guest address %#x is not in the VM's memory: %w", gpa, errkind.InvalidArgument)
		}
		offsets[i] = off
	}
	f, err := os.OpenFile(m.Path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ring: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, nil, fmt.Errorf("ring: %w", err)
	}
	key := regionKey{uint64(st.Dev), st.Ino, fmt.Sprint(chunks)}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.regions[key]
	if e == nil {
		if slices.ContainsFunc(offsets, func(o int64) bool { return o+ChunkSize > st.Size }) {
			return nil, nil, fmt.Errorf("ring chunk past the end of the memory file: %w", errkind.InvalidArgument)
		}
		mem, err := mapChunks(int(f.Fd()), offsets)
		if err != nil {
			return nil, nil, err
		}
		r, err := New(mem, Host)
		if err != nil {
			unix.Munmap(mem)
			return nil, nil, err
		}
		e = &shared{r: r}
		sh.regions[key] = e
	}
	e.refs++
	var once sync.Once
	release := func() {
		once.Do(func() {
			sh.mu.Lock()
			e.refs--
			last := e.refs == 0
			if last {
				delete(sh.regions, key)
			}
			sh.mu.Unlock()
			if last {
				e.r.unmap(unix.Munmap)
			}
		})
	}
	return e.r, release, nil
}

// mapChunks maps the file's pieces at offsets, ChunkSize each, side by
// side into one span of memory.
func mapChunks(fd int, offsets []int64) ([]byte, error) {
	size := len(offsets) * ChunkSize
	// Reserve the span, then map each piece over its place in it.
	span, err := unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("ring: reserve %d bytes: %w", size, err)
	}
	base := unsafe.Pointer(unsafe.SliceData(span))
	for i, off := range offsets {
		_, err := unix.MmapPtr(fd, off, unsafe.Add(base, i*ChunkSize), ChunkSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
		if err != nil {
			unix.Munmap(span)
			return nil, fmt.Errorf("ring: map chunk %d: %w", i, err)
		}
	}
	return span, nil
}
