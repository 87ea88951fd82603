package reflink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// Range is a byte range of a file.
type Range struct {
	Off, Len int64
}

// ErrNoExtents is returned by Changed where the file system does not map
// extents (tmpfs): the caller must treat the whole file as changed.
var ErrNoExtents = fmt.Errorf("file system reports no extents: %w", errkind.FailedPrecondition)

// Changed returns the byte ranges where file b may differ from file a,
// judged from their extent maps alone, without reading data: where both
// map an offset to the same physical block, that block is shared (a
// reflink made it so, and a file system never writes a shared block in
// place), so the data is the same. Everything else is reported: blocks
// mapped differently, data in one file and a hole in the other, and
// extents the file system cannot vouch for (delayed allocation, inline
// or encoded data). Ranges are block-aligned, sorted and disjoint. Both
// files are written back first.
//
// This is the dirty log of a guest whose memory file lives on reflink
// storage: a snapshot reflinks the file; pages the guest writes afterwards
// get new blocks; the next snapshot's reflink differs from the previous
// one exactly there.
func Changed(a, b string) ([]Range, error) {
	ea, err := extentsOf(a)
	if err != nil {
		return nil, err
	}
	eb, err := extentsOf(b)
	if err != nil {
		return nil, err
	}
	return diffExtents(ea, eb), nil
}

// extent is one mapped range of a file.
type extent struct {
	logical, physical, length int64
	trusted                   bool // the mapping says where the data is
}

func (e extent) end() int64 { return e.logical + e.length }

// FIEMAP, from linux/fiemap.h and linux/fs.h.
const (
	fsIocFiemap      = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapFlagSync   = 0x1
	fiemapHeaderSize = 32
	fiemapExtentSize = 56
	fiemapBatch      = 256

	extentLast      = 0x1
	extentUntrusted = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 // unknown, delalloc, encoded, encrypted, not aligned, inline, tail
)

// extentsOf returns the file's extents in logical order.
func extentsOf(path string) ([]extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]uint64, (fiemapHeaderSize+fiemapBatch*fiemapExtentSize)/8)
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*8)
	ne := binary.NativeEndian
	var out []extent
	flags := uint32(fiemapFlagSync) // the first call writes dirty pages back
	for start := uint64(0); ; {
		clear(raw)
		ne.PutUint64(raw[0:], start)
		ne.PutUint64(raw[8:], ^uint64(0)-start)
		ne.PutUint32(raw[16:], flags)
		ne.PutUint32(raw[24:], fiemapBatch)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			if errors.Is(errno, unix.EOPNOTSUPP) || errors.Is(errno, unix.ENOTTY) {
				return nil, fmt.Errorf("extents of %s: %w", path, ErrNoExtents)
			}
			return nil, fmt.Errorf("extents of %s: %w", path, errno)
		}
		flags = 0
		n := int(ne.Uint32(raw[20:]))
		if n == 0 {
			return out, nil
		}
		for i := range n {
			e := raw[fiemapHeaderSize+i*fiemapExtentSize:]
			fl := ne.Uint32(e[40:])
			out = append(out, extent{
				logical:  int64(ne.Uint64(e[0:])),
				physical: int64(ne.Uint64(e[8:])),
				length:   int64(ne.Uint64(e[16:])),
				trusted:  fl&extentUntrusted == 0,
			})
			if fl&extentLast != 0 {
				return out, nil
			}
		}
		last := out[len(out)-1]
		start = uint64(last.end())
	}
}

// diffExtents returns where b's mapping differs from a's (see Changed).
// Both lists are in logical order and internally disjoint.
func diffExtents(a, b []extent) []Range {
	// Every offset where either mapping changes, in order.
	var cuts []int64
	for _, l := range [][]extent{a, b} {
		for _, e := range l {
			cuts = append(cuts, e.logical, e.end())
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []Range
	ia, ib := 0, 0
	for k := 0; k+1 < len(cuts); k++ {
		lo, hi := cuts[k], cuts[k+1]
		for ia < len(a) && a[ia].end() <= lo {
			ia++
		}
		for ib < len(b) && b[ib].end() <= lo {
			ib++
		}
		var xa, xb *extent
		if ia < len(a) && a[ia].logical <= lo {
			xa = &a[ia]
		}
		if ib < len(b) && b[ib].logical <= lo {
			xb = &b[ib]
		}
		same := xa == nil && xb == nil || // a hole in both
			xa != nil && xb != nil && xa.trusted && xb.trusted &&
				xa.physical-xa.logical == xb.physical-xb.logical
		if same {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Off+out[n-1].Len == lo {
			out[n-1].Len += hi - lo
		} else {
			out = append(out, Range{Off: lo, Len: hi - lo})
		}
	}
	return out
}
