// Package cpio reads and writes "newc" cpio archives, the format the Linux
// kernel unpacks as an initramfs.
package cpio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"space/internal/errkind"
)

const (
	magic      = "070701"
	headerSize = 110 // magic plus 13 eight-digit hex fields
	trailer    = "TRAILER!!!"
)

// Unix file type bits of the mode field.
const (
	sIFMT  = 0o170000
	sIFDIR = 0o040000
	sIFREG = 0o100000
	sIFLNK = 0o120000
	sIFCHR = 0o020000
	sIFBLK = 0o060000
)

// Entry is one archive member.
type Entry struct {
	Name  string      // path without a leading "/", e.g. "dev/console"
	Mode  fs.FileMode // type (dir, symlink, device, char device, or regular) and permissions
	Major uint32      // device number of a device node; 0 otherwise
	Minor uint32
	Data  []byte // content of a regular file, or a symlink's target
}

// Writer writes a newc archive. Entries get consecutive inode numbers, owner
// 0:0 and mtime 0, so the same entries in the same order give the same bytes.
// Callers must Close it to write the trailer.
type Writer struct {
	w   io.Writer
	ino uint32
	off int64
	err error // first write error; sticky
}

// NewWriter returns a Writer that writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Add writes e. Parent directories must have been added before it for the
// kernel to unpack it.
func (w *Writer) Add(e Entry) error {
	name := strings.TrimPrefix(e.Name, "/")
	if name == "" || name == trailer {
		return fmt.Errorf("cpio: invalid entry name %q: %w", e.Name, errkind.InvalidArgument)
	}
	mode := uint32(e.Mode.Perm())
	if e.Mode&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if e.Mode&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if e.Mode&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	nlink := uint32(1)
	switch e.Mode.Type() {
	case 0:
		mode |= sIFREG
	case fs.ModeDir:
		mode |= sIFDIR
		nlink = 2
	case fs.ModeSymlink:
		mode |= sIFLNK
	case fs.ModeDevice | fs.ModeCharDevice:
		mode |= sIFCHR
	case fs.ModeDevice:
		mode |= sIFBLK
	default:
		return fmt.Errorf("cpio: %s: unsupported file type %v: %w", name, e.Mode.Type(), errkind.InvalidArgument)
	}
	if (e.Mode.IsDir() || e.Mode&fs.ModeDevice != 0) && len(e.Data) > 0 {
		return fmt.Errorf("cpio: %s: %v entry with data: %w", name, e.Mode.Type(), errkind.InvalidArgument)
	}
	w.ino++
	return w.write(w.ino, mode, nlink, e.Major, e.Minor, name, e.Data)
}

// Close writes the trailer. It does not close the underlying writer.
func (w *Writer) Close() error {
	return w.write(0, 0, 1, 0, 0, trailer, nil)
}

func (w *Writer) write(ino, mode, nlink, major, minor uint32, name string, data []byte) error {
	if w.err != nil {
		return w.err
	}
	var b strings.Builder
	b.WriteString(magic)
	for _, v := range []uint32{
		ino, mode, 0 /* uid */, 0 /* gid */, nlink, 0, /* mtime */
		uint32(len(data)), 0, 0 /* dev major, minor */, major, minor /* rdev */, uint32(len(name) + 1), 0, /* check */
	} {
		fmt.Fprintf(&b, "%08x", v)
	}
	b.WriteString(name)
	b.WriteByte(0)
	b.WriteString(pad(headerSize + len(name) + 1))
	hdr := b.String()
	if _, err := io.WriteString(w.w, hdr); err != nil {
		w.err = err
		return err
	}
	if _, err := w.w.Write(data); err != nil {
		w.err = err
		return err
	}
	if _, err := io.WriteString(w.w, pad(len(data))); err != nil {
		w.err = err
		return err
	}
	return nil
}

// pad returns the NULs that align n to 4 bytes.
func pad(n int) string { return "\x00\x00\x00"[:(4-n%4)%4] }

// Reader reads a newc archive.
type Reader struct {
	r *bufio.Reader
}

// NewReader returns a Reader that reads from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReader(r)} }

// Next returns the next entry, or io.EOF after the trailer. Malformed input
// yields [errkind.InvalidArgument].
func (r *Reader) Next() (Entry, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		return Entry{}, corrupt("header", err)
	}
	if string(hdr[:6]) != magic {
		return Entry{}, fmt.Errorf("cpio: bad magic %q: %w", hdr[:6], errkind.InvalidArgument)
	}
	var f [13]uint32
	for i := range f {
		v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
		if err != nil {
			return Entry{}, fmt.Errorf("cpio: bad header field %d: %w", i, errkind.InvalidArgument)
		}
		f[i] = uint32(v)
	}
	mode, size, namesize := f[1], f[6], f[11]
	if namesize == 0 || namesize > 4096 {
		return Entry{}, fmt.Errorf("cpio: bad name size %d: %w", namesize, errkind.InvalidArgument)
	}
	name := make([]byte, int(namesize)+len(pad(headerSize+int(namesize))))
	if _, err := io.ReadFull(r.r, name); err != nil {
		return Entry{}, corrupt("name", err)
	}
	e := Entry{Name: strings.TrimRight(string(name[:namesize]), "\x00"), Major: f[9], Minor: f[10]}
	if e.Name == trailer {
		return Entry{}, io.EOF
	}
	if size > 0 {
		// ReadAll grows the buffer as data arrives, so a bogus size in a
		// short archive costs no huge allocation.
		data, err := io.ReadAll(io.LimitReader(r.r, int64(size)+int64(len(pad(int(size))))))
		if err != nil {
			return Entry{}, corrupt("data of "+e.Name, err)
		}
		if len(data) < int(size)+len(pad(int(size))) {
			return Entry{}, corrupt("data of "+e.Name, io.ErrUnexpectedEOF)
		}
		e.Data = data[:size]
	}
	e.Mode = fs.FileMode(mode & 0o777)
	if mode&0o4000 != 0 {
		e.Mode |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		e.Mode |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		e.Mode |= fs.ModeSticky
	}
	switch mode & sIFMT {
	case sIFREG:
	case sIFDIR:
		e.Mode |= fs.ModeDir
	case sIFLNK:
		e.Mode |= fs.ModeSymlink
	case sIFCHR:
		e.Mode |= fs.ModeDevice | fs.ModeCharDevice
	case sIFBLK:
		e.Mode |= fs.ModeDevice
	default:
		return Entry{}, fmt.Errorf("cpio: %s: unsupported file type %#o: %w", e.Name, mode&sIFMT, errkind.InvalidArgument)
	}
	return e, nil
}

func corrupt(what string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("cpio: truncated %s: %w", what, errkind.InvalidArgument)
	}
	return fmt.Errorf("cpio: read %s: %w", what, err)
}
