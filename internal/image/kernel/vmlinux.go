package kernel

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"

	"space/internal/errkind"
)

// Compressed payload magics, as the kernel's decompressors recognise them.
var (
	magicLZ4Legacy = []byte{0x02, 0x21, 0x4c, 0x18}
	magicGzip      = []byte{0x1f, 0x8b, 0x08}
	magicXZ        = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicZstd      = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicBzip2     = []byte{'B', 'Z', 'h'}
	magicLZMA      = []byte{0x5d, 0x00, 0x00}
	magicLZO       = []byte{0x89, 'L', 'Z', 'O'}
)

// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY, the note type that
// carries the 32-bit PVH entry point.
const xenElfnotePhys32Entry = 18

// ExtractVmlinux returns the uncompressed ELF kernel inside a bzImage (a
// vmlinuz). The payload is found through the boot protocol header
// (payload_offset, payload_length) or, for images without one, by scanning
// for a compression magic. LZ4 (legacy frames, as Debian uses), gzip and xz
// payloads are supported; others yield [errkind.InvalidArgument]. The result
// must be an ELF with a Xen PVH entry note (so that it can be booted
// directly); otherwise the error wraps [errkind.InvalidArgument] too.
func ExtractVmlinux(bzImage []byte) ([]byte, error) {
	payload := payloadOf(bzImage)
	var (
		out []byte
		err error
	)
	switch {
	case bytes.HasPrefix(payload, magicLZ4Legacy):
		out, err = unlz4Legacy(payload)
	case bytes.HasPrefix(payload, magicGzip):
		out, err = gunzip(payload)
	case bytes.HasPrefix(payload, magicXZ):
		out, err = readAll(xz.NewReader(bytes.NewReader(xzStream(payload))))
	case bytes.HasPrefix(payload, magicZstd), bytes.HasPrefix(payload, magicBzip2),
		bytes.HasPrefix(payload, magicLZMA), bytes.HasPrefix(payload, magicLZO):
		return nil, fmt.Errorf("extract vmlinux: unsupported compression (magic % x): %w", payload[:4], errkind.InvalidArgument)
	default:
		return nil, fmt.Errorf("extract vmlinux: no compressed kernel payload found: %w", errkind.InvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("extract vmlinux: %w", err)
	}
	if err := checkPVH(out); err != nil {
		return nil, fmt.Errorf("extract vmlinux: %w", err)
	}
	return out, nil
}

// payloadOf returns the compressed payload of a bzImage, from the header
// when it has a valid one (boot protocol 2.08+), else from the first known
// compression magic. It returns nil if neither finds anything.
func payloadOf(img []byte) []byte {
	if len(img) >= 0x250 && string(img[0x202:0x206]) == "HdrS" && binary.LittleEndian.Uint16(img[0x206:]) >= 0x208 {
		setupSects := int(img[0x1f1])
		if setupSects == 0 {
			setupSects = 4 // boot protocol: 0 means 4
		}
		start := (setupSects + 1) * 512
		off := int(binary.LittleEndian.Uint32(img[0x248:]))
		n := int(binary.LittleEndian.Uint32(img[0x24c:]))
		if n > 0 && start+off+n <= len(img) && start+off >= start {
			return img[start+off : start+off+n]
		}
	}
	best := -1
	for _, m := range [][]byte{magicLZ4Legacy, magicGzip, magicXZ, magicZstd} {
		if i := bytes.Index(img, m); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	return img[best:]
}

// LZ4 legacy frames hold blocks that each decompress to at most 8 MiB.
const lz4LegacyBlock = 8 << 20

// unlz4Legacy decodes an LZ4 legacy stream: the magic, then blocks of
// [u32 LE compressed size][compressed block]. Like the kernel's decoder it
// accepts repeated magics (concatenated streams) and stops at the end of the
// input or at a size that cannot be a block (such as the uncompressed size
// the kernel build appends).
func unlz4Legacy(src []byte) ([]byte, error) {
	var out []byte
	buf := make([]byte, lz4LegacyBlock)
	maxBlock := lz4.CompressBlockBound(lz4LegacyBlock)
	p := 0
	for p+4 <= len(src) {
		if bytes.Equal(src[p:p+4], magicLZ4Legacy) {
			p += 4
			continue
		}
		size := int(binary.LittleEndian.Uint32(src[p:]))
		if size == 0 || size > maxBlock || size > len(src)-p-4 {
			break // trailer or garbage: the stream has ended
		}
		p += 4
		n, err := lz4.UncompressBlock(src[p:p+size], buf)
		if err != nil {
			return nil, fmt.Errorf("lz4 block at offset %d: %w", p, err)
		}
		out = append(out, buf[:n]...)
		p += size
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("lz4 stream holds no blocks: %w", errkind.InvalidArgument)
	}
	return out, nil
}

// gunzip decodes the single gzip member at the start of b, ignoring what
// follows it.
func gunzip(b []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	zr.Multistream(false)
	return io.ReadAll(zr)
}

// xzStream drops the uncompressed size the kernel build appends to an xz
// payload: an xz stream ends with the footer magic "YZ".
func xzStream(b []byte) []byte {
	if n := len(b); n >= 6 && !bytes.HasSuffix(b, []byte("YZ")) && string(b[n-6:n-4]) == "YZ" {
		return b[:n-4]
	}
	return b
}

func readAll(r io.Reader, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// checkPVH reports an error unless b is an ELF file with a Xen PVH entry
// note (XEN_ELFNOTE_PHYS32_ENTRY) in a PT_NOTE segment or SHT_NOTE section.
func checkPVH(b []byte) error {
	if !bytes.HasPrefix(b, []byte(elf.ELFMAG)) {
		return fmt.Errorf("payload is not an ELF file: %w", errkind.InvalidArgument)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("payload ELF: %v: %w", err, errkind.InvalidArgument)
	}
	defer f.Close()
	var notes []io.Reader
	for _, p := range f.Progs {
		if p.Type == elf.PT_NOTE {
			notes = append(notes, p.Open())
		}
	}
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOTE {
			notes = append(notes, s.Open())
		}
	}
	for _, r := range notes {
		data, err := io.ReadAll(r)
		if err != nil {
			continue
		}
		if hasNote(data, f.ByteOrder, "Xen", xenElfnotePhys32Entry) {
			return nil
		}
	}
	return fmt.Errorf("ELF has no Xen PVH entry note: %w", errkind.InvalidArgument)
}

// hasNote reports whether the ELF note area data holds a note with the given
// name and type.
func hasNote(data []byte, bo binary.ByteOrder, name string, typ uint32) bool {
	align4 := func(n uint32) int { return int((n + 3) &^ 3) }
	for len(data) >= 12 {
		namesz, descsz, t := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		data = data[12:]
		if align4(namesz) > len(data) || namesz > 1<<16 {
			return false
		}
		n := string(bytes.TrimRight(data[:namesz], "\x00"))
		data = data[align4(namesz):]
		if align4(descsz) > len(data) || descsz > 1<<20 {
			return n == name && t == typ && int(descsz) <= len(data)
		}
		if n == name && t == typ {
			return true
		}
		data = data[align4(descsz):]
	}
	return false
}
