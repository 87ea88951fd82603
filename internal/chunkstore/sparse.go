package chunkstore

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// dataRanges returns the data regions of f's first size bytes, sorted and
// disjoint, found with SEEK_DATA/SEEK_HOLE. Where the file system does not
// support them, the whole file is one data region.
func dataRanges(f *os.File, size int64) ([]Range, error) {
	if size == 0 {
		return nil, nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var rs []Range
	var serr error
	err = rc.Control(func(fd uintptr) {
		rs, serr = seekData(int(fd), size)
	})
	if err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("find data regions of %s: %w", f.Name(), serr)
	}
	return rs, nil
}

func seekData(fd int, size int64) ([]Range, error) {
	var rs []Range
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole from off to the end
		}
		if err != nil {
			if off == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
				return []Range{{Off: 0, Len: size}}, nil // not supported here
			}
			return nil, err
		}
		if start >= size {
			break
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		end = min(end, size)
		rs = append(rs, Range{Off: start, Len: end - start})
		off = end
	}
	return rs, nil
}
