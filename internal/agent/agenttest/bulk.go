package agenttest

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
)

// testRanges reads parts of a file: from an offset, a length, across the
// ring's slot size, past the end.
func testRanges(t *testing.T, c *client.Client, opts Options) {
	p := opts.Scratch + "/ranges"
	data := make([]byte, 1<<20+12345)
	rand.Read(data)
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p}, bytes.NewReader(data)); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	size := int64(len(data))
	tests := []struct {
		name        string
		off, length int64
		want        []byte
	}{
		{"from offset to end", 300000, 0, data[300000:]},
		{"small middle", 7, 100, data[7:107]},
		{"slot-sized middle", 1000, 256 << 10, data[1000 : 1000+256<<10]},
		{"length past end", size - 10, 1000, data[size-10:]},
		{"offset at end", size, 0, nil},
		{"offset past end", size + 5, 10, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got bytes.Buffer
			info, err := c.ReadFileRange(ctx(t, time.Minute), proto.ReadArgs{Path: p, Offset: tt.off, Length: tt.length}, &got)
			if err != nil {
				t.Fatalf("ReadFileRange(%d, %d) = %v", tt.off, tt.length, err)
			}
			if !bytes.Equal(got.Bytes(), tt.want) || info.Size != int64(len(tt.want)) {
				t.Errorf("ReadFileRange(%d, %d) = %d bytes (info %d), want %d exact", tt.off, tt.length, got.Len(), info.Size, len(tt.want))
			}
		})
	}
	if _, err := c.ReadFileRange(ctx(t, time.Minute), proto.ReadArgs{Path: p, Offset: -1}, io.Discard); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("ReadFileRange(offset -1) = %v, want InvalidArgument", err)
	}
}

// testAppend writes a file in place in parts, the way a resumable upload
// does, including a part whose source breaks off: what arrived stays.
func testAppend(t *testing.T, c *client.Client, opts Options) {
	p := opts.Scratch + "/append"
	data := make([]byte, 3<<20)
	rand.Read(data)
	at := func(n int64) *int64 { return &n }
	res, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p, Mode: 0o600, At: at(0)}, bytes.NewReader(data[:1<<20]))
	if err != nil || res.EndSize != 1<<20 {
		t.Fatalf("WriteFile(at 0) = %+v, %v; want end size %d", res, err, 1<<20)
	}
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p, At: at(5)}, strings.NewReader("x")); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("WriteFile(at a wrong offset) = %v, want FailedPrecondition", err)
	}
	// A source that fails after 700 KiB: the agent keeps what came.
	cut := io.MultiReader(bytes.NewReader(data[1<<20:1<<20+700<<10]), errReader{})
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p, At: at(1 << 20)}, cut); err == nil {
		t.Fatalf("WriteFile(cut source) succeeded")
	}
	var st proto.FileInfo
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The agent may still be writing the last frames it got.
		if st, err = c.Stat(ctx(t, time.Minute), p); err != nil {
			t.Fatalf("Stat = %v", err)
		}
		if st.Size == 1<<20+700<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Size < 1<<20 || st.Size > 1<<20+700<<10 {
		t.Fatalf("after a cut part the file holds %d bytes, want a prefix between %d and %d", st.Size, 1<<20, 1<<20+700<<10)
	}
	if res, err = c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p, At: at(st.Size)}, bytes.NewReader(data[st.Size:])); err != nil || res.EndSize != int64(len(data)) {
		t.Fatalf("WriteFile(resume at %d) = %+v, %v", st.Size, res, err)
	}
	var back bytes.Buffer
	info, err := c.ReadFile(ctx(t, time.Minute), p, &back)
	if err != nil || !bytes.Equal(back.Bytes(), data) || info.Mode != 0o600 {
		t.Errorf("resumed file: %d bytes, mode %o, %v; want %d exact, mode 0600", back.Len(), info.Mode, err, len(data))
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source broke off") }

// testTar sends a directory both ways as tar, and checks that a cut or
// bad archive leaves the target as it was.
func testTar(t *testing.T, c *client.Client, opts Options) {
	src, dst := opts.Scratch+"/tar-src", opts.Scratch+"/tar-dst"
	big := make([]byte, 2<<20+3)
	rand.Read(big)
	files := map[string][]byte{"a.txt": []byte("alpha\n"), "sub/deep/big.bin": big, "sub/empty": nil}
	for name, b := range files {
		if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: src + "/" + name, MkdirAll: true}, bytes.NewReader(b)); err != nil {
			t.Fatalf("WriteFile(%s) = %v", name, err)
		}
	}
	var archive bytes.Buffer
	if _, err := c.TarRead(ctx(t, time.Minute), src, &archive); err != nil {
		t.Fatalf("TarRead = %v", err)
	}
	got := tarFiles(t, archive.Bytes())
	for name, b := range files {
		if !bytes.Equal(got[name], b) {
			t.Errorf("archive entry %s: %d bytes, want %d exact", name, len(got[name]), len(b))
		}
	}
	res, err := c.TarWrite(ctx(t, time.Minute), proto.TarWriteArgs{Path: dst, MkdirAll: true}, bytes.NewReader(archive.Bytes()))
	if err != nil || res.Bytes != int64(len(big)+6) {
		t.Fatalf("TarWrite = %+v, %v; want %d bytes", res, err, len(big)+6)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx(t, time.Minute), dst+"/sub/deep/big.bin", &back); err != nil || !bytes.Equal(back.Bytes(), big) {
		t.Errorf("unpacked big.bin: %d bytes, %v; want %d exact", back.Len(), err, len(big))
	}
	// Cut mid-archive, or an entry escaping the directory: nothing of it
	// lands in dst.
	bad := map[string]io.Reader{
		"cut":    bytes.NewReader(archive.Bytes()[:archive.Len()/2]),
		"escape": bytes.NewReader(tarOf(t, "ok.txt", "../escaped.txt")),
	}
	for name, r := range bad {
		if _, err := c.TarWrite(ctx(t, time.Minute), proto.TarWriteArgs{Path: dst}, r); err == nil {
			t.Errorf("TarWrite(%s archive) succeeded", name)
		}
	}
	for _, p := range []string{dst + "/ok.txt", opts.Scratch + "/escaped.txt"} {
		if _, err := c.Stat(ctx(t, time.Minute), p); !errors.Is(err, errkind.NotFound) {
			t.Errorf("after refused archives, Stat(%s) = %v, want NotFound", p, err)
		}
	}
	entries, err := c.List(ctx(t, time.Minute), opts.Scratch, 0)
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name, ".space-untar-") {
			t.Errorf("a staging directory stayed behind: %s", e.Name)
		}
	}
	if _, err := c.TarRead(ctx(t, time.Minute), src+"/a.txt", io.Discard); !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("TarRead(a file) = %v, want FailedPrecondition", err)
	}
}

// tarOf returns an archive of small files with the given names.
func tarOf(t *testing.T, names ...string) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte("x\n"))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// tarFiles returns the regular files of an archive the agent sent, by
// name.
func tarFiles(t *testing.T, archive []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("the agent's archive: %v", err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatalf("the agent's archive: %s: %v", h.Name, err)
			}
			files[h.Name] = b
		}
	}
}
