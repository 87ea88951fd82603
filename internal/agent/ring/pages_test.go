package ring

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"space/internal/errkind"
	"space/internal/testenv"
)

func TestPagesRefRoundTrip(t *testing.T) {
	in := PagesRef{Type: 4, ID: 7, Len: 9000, Extents: []Extent{{GPA: 0x1000_0123, Len: 3973}, {GPA: 0x8000, Len: 4096}, {GPA: 0x20000, Len: 931}}}
	out, err := ParsePagesRef(in.Append(nil))
	if err != nil {
		t.Fatalf("ParsePagesRef(Append(%+v)) = %v", in, err)
	}
	if out.Type != in.Type || out.ID != in.ID || out.Len != in.Len || !slices.Equal(out.Extents, in.Extents) {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
}

func TestParsePagesRefRefusesBadShapes(t *testing.T) {
	one := func(gpa uint64, n uint32) []Extent { return []Extent{{GPA: gpa, Len: n}} }
	tooMany := make([]Extent, maxExtents+1)
	for i := range tooMany {
		tooMany[i] = Extent{GPA: uint64(i) * 8192, Len: 1}
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"short", []byte{4, 0, 0}},
		{"no extents", PagesRef{Type: 4, Len: 1}.Append(nil)},
		{"sum short of the length", PagesRef{Type: 4, Len: 10, Extents: one(0, 9)}.Append(nil)},
		{"sum past the length", PagesRef{Type: 4, Len: 10, Extents: one(0, 11)}.Append(nil)},
		{"empty extent", PagesRef{Type: 4, Len: 10, Extents: []Extent{{GPA: 0, Len: 10}, {GPA: 4096, Len: 0}}}.Append(nil)},
		{"zero length", PagesRef{Type: 4, Len: 0, Extents: one(0, 0)}.Append(nil)},
		{"above a piece", PagesRef{Type: 4, Len: MaxPiece + 1, Extents: one(0, MaxPiece+1)}.Append(nil)},
		{"address wraps", PagesRef{Type: 4, Len: 4096, Extents: one(^uint64(0)-10, 4096)}.Append(nil)},
		{"too many extents", PagesRef{Type: 4, Len: uint32(len(tooMany)), Extents: tooMany}.Append(nil)},
		{"trailing bytes", append(PagesRef{Type: 4, Len: 5, Extents: one(0, 5)}.Append(nil), 0)},
	} {
		if _, err := ParsePagesRef(tt.b); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("%s: ParsePagesRef = %v, want invalid argument", tt.name, err)
		}
	}
}

func TestMemoryFileReadGuest(t *testing.T) {
	// A memory file laid out as q35 does above its low-memory limit: the
	// first 1 MiB at 0, the next 1 MiB at 4 GiB.
	path := filepath.Join(t.TempDir(), "mem")
	data := make([]byte, 2<<20)
	rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m := GuestMemory{Path: path, Ranges: []MemRange{{GPA: 0, Offset: 0, Size: 1 << 20}, {GPA: 4 << 30, Offset: 1 << 20, Size: 1 << 20}}}
	mf, err := OpenMemory(m)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	for _, tt := range []struct {
		gpa uint64
		n   int
		off int // in the file
	}{
		{0, 4096, 0},
		{1<<20 - 100, 100, 1<<20 - 100},
		{4<<30 + 5, 70000, 1<<20 + 5},
		{4<<30 + 1<<20 - 1, 1, 2<<20 - 1},
	} {
		got := make([]byte, tt.n)
		if err := mf.ReadGuest(got, tt.gpa); err != nil || !bytes.Equal(got, data[tt.off:tt.off+tt.n]) {
			t.Errorf("ReadGuest(%d bytes at %#x) = %v, or not the file's bytes at %d", tt.n, tt.gpa, err, tt.off)
		}
	}
	// Outside the RAM, or across the hole between its ranges: refused.
	for _, tt := range []struct {
		gpa uint64
		n   int
	}{
		{1<<20 - 100, 101},
		{1 << 20, 1},
		{2 << 30, 4096},
		{4<<30 + 1<<20, 1},
		{4<<30 - 1, 2},
		{^uint64(0) - 5, 100},
	} {
		if err := mf.ReadGuest(make([]byte, tt.n), tt.gpa); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("ReadGuest(%d bytes at %#x) = %v, want invalid argument", tt.n, tt.gpa, err)
		}
	}
}

// TestPinFilePages pins pieces of a file on this host. The addresses it
// returns are this host's physical memory, which a test cannot read, so
// it checks the shape of the answer and that unpinning gives the pipes
// back; a guest's host copying real bytes is
// TestRealVM/Conformance/FileReadInPlace.
func TestPinFilePages(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierNetns) // pagemap shows frame numbers only to CAP_SYS_ADMIN
	p, err := OpenFilePages()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "f")
	data := make([]byte, 3<<20+100)
	rand.Read(data)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tt := range []struct {
		off int64
		n   int
	}{
		{0, p.Piece()},
		{100, 5000},
		{int64(p.Piece()) - 1, 2},
		{int64(p.Piece()) + 4095, p.Piece() - 4095},
		{3 << 20, 100},
	} {
		ext, unpin, err := p.Pin(f, tt.off, tt.n)
		if err != nil {
			t.Fatalf("Pin(%d bytes at %d) = %v", tt.n, tt.off, err)
		}
		sum := 0
		for i, e := range ext {
			sum += int(e.Len)
			if i > 0 && e.GPA%PageSize != 0 {
				t.Errorf("Pin(%d bytes at %d): extent %d at %#x does not start a page", tt.n, tt.off, i, e.GPA)
			}
		}
		if sum != tt.n || ext[0].GPA%PageSize != uint64(tt.off%PageSize) {
			t.Errorf("Pin(%d bytes at %d) = %d bytes from %#x", tt.n, tt.off, sum, ext[0].GPA)
		}
		unpin()
	}
	p.mu.Lock()
	pipes := len(p.pipes)
	p.mu.Unlock()
	if pipes != 1 {
		t.Errorf("%d pipes kept after sequential pins, want the one reused", pipes)
	}
	// Past the end there are no pages.
	if _, _, err := p.Pin(f, 4<<20, 4096); err == nil {
		t.Errorf("Pin past the end of the file succeeded")
	}
	for _, tt := range []struct {
		off int64
		n   int
	}{{-1, 10}, {0, 0}, {0, p.Piece() + 1}, {1, p.Piece()}} {
		if _, _, err := p.Pin(f, tt.off, tt.n); !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("Pin(%d bytes at %d) = %v, want invalid argument", tt.n, tt.off, err)
		}
	}
}
