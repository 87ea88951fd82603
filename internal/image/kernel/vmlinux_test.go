package kernel

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/ulikunitz/xz"

	"space/internal/errkind"
)

// fakeVmlinux returns a minimal x86-64 ELF with one PT_NOTE segment holding
// a note of the given name and type, followed by size bytes of filler.
func fakeVmlinux(t *testing.T, noteName string, noteType uint32, size int) []byte {
	t.Helper()
	var note bytes.Buffer
	name := append([]byte(noteName), 0)
	for len(name)%4 != 0 {
		name = append(name, 0)
	}
	binary.Write(&note, binary.LittleEndian, []uint32{uint32(len(noteName) + 1), 4, noteType})
	note.Write(name)
	binary.Write(&note, binary.LittleEndian, uint32(0x1000000)) // entry point
	const phoff = 64
	dataOff := uint64(phoff + 56)
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Phoff: phoff, Ehsize: 64, Phentsize: 56, Phnum: 1, Shentsize: 64,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	prog := elf.Prog64{Type: uint32(elf.PT_NOTE), Flags: uint32(elf.PF_R), Off: dataOff,
		Filesz: uint64(note.Len()), Memsz: uint64(note.Len()), Align: 4}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, hdr)
	binary.Write(&b, binary.LittleEndian, prog)
	b.Write(note.Bytes())
	for i := 0; i < size; i++ {
		b.WriteByte(byte(i / 4096)) // compressible but not constant
	}
	return b.Bytes()
}

// lz4Legacy compresses data as the kernel build does (lz4 -l): legacy magic,
// 8 MiB blocks, then the uncompressed size appended.
func lz4Legacy(t *testing.T, data []byte) []byte {
	t.Helper()
	out := append([]byte(nil), magicLZ4Legacy...)
	for len(data) > 0 {
		n := min(len(data), lz4LegacyBlock)
		dst := make([]byte, lz4.CompressBlockBound(n))
		c, err := lz4.CompressBlock(data[:n], dst, nil)
		if err != nil || c == 0 {
			t.Fatalf("setup: lz4 compress: %d, %v", c, err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(c))
		out = append(out, dst[:c]...)
		data = data[n:]
	}
	return out
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatalf("setup: gzip: %v", err)
	}
	return b.Bytes()
}

func xzed(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := xz.NewWriter(&b)
	if err != nil {
		t.Fatalf("setup: xz: %v", err)
	}
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatalf("setup: xz: %v", err)
	}
	return b.Bytes()
}

// bzImage wraps payload in a bzImage with a boot protocol 2.15 header. A
// decoy gzip magic precedes the payload, so only header parsing finds it.
func bzImage(payload []byte, uncompressed int) []byte {
	const setupSects = 3
	img := make([]byte, (setupSects+1)*512)
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x020f)
	img = append(img, make([]byte, 0x100)...)
	copy(img[len(img)-0x80:], magicGzip) // decoy
	binary.LittleEndian.PutUint32(img[0x248:], 0x100)
	sized := binary.LittleEndian.AppendUint32(append([]byte(nil), payload...), uint32(uncompressed))
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(sized)))
	img = append(img, sized...)
	return append(img, "trailing code and signature"...)
}

func TestExtractVmlinux(t *testing.T) {
	pvh := fakeVmlinux(t, "Xen", xenElfnotePhys32Entry, 9<<20) // more than one LZ4 block
	small := fakeVmlinux(t, "Xen", xenElfnotePhys32Entry, 1000)
	tests := []struct {
		name    string
		img     []byte
		want    []byte
		wantErr error
	}{
		{"lz4 legacy, two blocks", bzImage(lz4Legacy(t, pvh), len(pvh)), pvh, nil},
		{"lz4 concatenated streams", bzImage(append(lz4Legacy(t, small[:500]), lz4Legacy(t, small[500:])...), len(small)), small, nil},
		{"gzip", bzImage(gzipped(t, small), len(small)), small, nil},
		{"xz", bzImage(xzed(t, small), len(small)), small, nil},
		{"no header, scanned", append([]byte("MZ setup code"), binary.LittleEndian.AppendUint32(lz4Legacy(t, small), uint32(len(small)))...), small, nil},
		{"zstd", bzImage(append([]byte{0x28, 0xb5, 0x2f, 0xfd}, small...), len(small)), nil, errkind.InvalidArgument},
		{"no PVH note", bzImage(lz4Legacy(t, fakeVmlinux(t, "Linux", 1, 100)), 0), nil, errkind.InvalidArgument},
		{"Xen note of another type", bzImage(lz4Legacy(t, fakeVmlinux(t, "Xen", 1, 100)), 0), nil, errkind.InvalidArgument},
		{"payload not ELF", bzImage(lz4Legacy(t, bytes.Repeat([]byte("text"), 100)), 400), nil, errkind.InvalidArgument},
		{"no payload", []byte("just some bytes"), nil, errkind.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ExtractVmlinux(tt.img)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ExtractVmlinux() = %v, want %v", err, tt.wantErr)
			}
			if !bytes.Equal(got, tt.want) {
				t.Errorf("ExtractVmlinux() = %d bytes, want %d bytes (equal: false)", len(got), len(tt.want))
			}
		})
	}
}

func TestUnlz4LegacyCorrupt(t *testing.T) {
	// A block announcing 15 literals that are not there.
	stream := append(append([]byte(nil), magicLZ4Legacy...), 2, 0, 0, 0, 0xf0, 0x00)
	if got, err := unlz4Legacy(stream); err == nil {
		t.Errorf("unlz4Legacy(corrupt block) = %d bytes, nil error; want an error", len(got))
	}
}
