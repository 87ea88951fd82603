package apt

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/ulikunitz/xz"

	"space/internal/errkind"
)

// tarEntry is one entry of a test data.tar.
type tarEntry struct {
	name, body, link string
	typ              byte
}

func makeTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("setup: tar header %s: %v", e.name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatalf("setup: tar body %s: %v", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("setup: tar: %v", err)
	}
	return b.Bytes()
}

func compress(t *testing.T, ext string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	switch ext {
	case "":
		return data
	case ".gz":
		zw := gzip.NewWriter(&b)
		zw.Write(data)
		if err := zw.Close(); err != nil {
			t.Fatalf("setup: gzip: %v", err)
		}
	case ".xz":
		zw, err := xz.NewWriter(&b)
		if err != nil {
			t.Fatalf("setup: xz: %v", err)
		}
		zw.Write(data)
		if err := zw.Close(); err != nil {
			t.Fatalf("setup: xz: %v", err)
		}
	case ".zst":
		return append([]byte{0x28, 0xb5, 0x2f, 0xfd}, data...) // only the magic matters
	}
	return b.Bytes()
}

// makeAr returns an ar archive of the members, given as name, content pairs.
func makeAr(members ...string) []byte {
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for i := 0; i+1 < len(members); i += 2 {
		name, body := members[i], members[i+1]
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", name+"/", 0, 0, 0, "100644", len(body))
		b.WriteString(body)
		if len(body)%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func makeDeb(t *testing.T, dataExt string, entries []tarEntry) string {
	t.Helper()
	data := compress(t, dataExt, makeTar(t, entries))
	control := compress(t, ".gz", makeTar(t, []tarEntry{{name: "./control", body: "Package: x\n"}}))
	p := filepath.Join(t.TempDir(), "x.deb")
	if err := os.WriteFile(p, makeAr("debian-binary", "2.0\n", "control.tar.gz", string(control), "data.tar"+dataExt, string(data)), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return p
}

// listTree describes every file below dir: "dir", "file:<content>" or
// "link:<target>".
func listTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.IsDir():
			got[rel] = "dir"
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			got[rel] = "link:" + target
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			got[rel] = "file:" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("list %s: %v", dir, err)
	}
	return got
}

var kernelLike = []tarEntry{
	{name: "./", typ: tar.TypeDir},
	{name: "./boot/", typ: tar.TypeDir},
	{name: "./boot/vmlinuz-1.0", body: "bz", typ: tar.TypeReg},
	{name: "./boot/config-1.0", body: "cfg", typ: tar.TypeReg},
	{name: "./lib/", typ: tar.TypeDir},
	{name: "./lib/modules/", typ: tar.TypeDir},
	{name: "./lib/modules/1.0/", typ: tar.TypeDir},
	{name: "./lib/modules/1.0/kernel/a.ko", body: "odd", typ: tar.TypeReg},
	{name: "./lib/modules/1.0/kernel/b.ko", link: "a.ko", typ: tar.TypeSymlink},
	{name: "./lib/modules/1.0/kernel/c.ko", link: "./lib/modules/1.0/kernel/a.ko", typ: tar.TypeLink},
	{name: "./usr/share/doc/x", body: "doc", typ: tar.TypeReg},
}

func TestExtract(t *testing.T) {
	tests := []struct {
		name     string
		ext      string
		entries  []tarEntry
		prefixes []string
		want     map[string]string
	}{
		{
			name:     "xz with prefixes",
			ext:      ".xz",
			entries:  kernelLike,
			prefixes: []string{"boot/vmlinuz-", "lib/modules/"},
			want: map[string]string{
				"boot":                        "dir",
				"boot/vmlinuz-1.0":            "file:bz",
				"lib":                         "dir",
				"lib/modules":                 "dir",
				"lib/modules/1.0":             "dir",
				"lib/modules/1.0/kernel":      "dir",
				"lib/modules/1.0/kernel/a.ko": "file:odd",
				"lib/modules/1.0/kernel/b.ko": "link:a.ko",
				"lib/modules/1.0/kernel/c.ko": "file:odd",
			},
		},
		{
			name:    "gzip everything",
			ext:     ".gz",
			entries: kernelLike[:4],
			want:    map[string]string{"boot": "dir", "boot/vmlinuz-1.0": "file:bz", "boot/config-1.0": "file:cfg"},
		},
		{
			name:     "uncompressed",
			entries:  kernelLike,
			prefixes: []string{"usr/"},
			want:     map[string]string{"usr": "dir", "usr/share": "dir", "usr/share/doc": "dir", "usr/share/doc/x": "file:doc"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deb := makeDeb(t, tt.ext, tt.entries)
			dir := t.TempDir()
			if err := Extract(t.Context(), deb, dir, tt.prefixes...); err != nil {
				t.Fatalf("Extract(%v) = %v, want nil", tt.prefixes, err)
			}
			if diff := cmp.Diff(tt.want, listTree(t, dir)); diff != "" {
				t.Errorf("Extract(%v) tree mismatch (-want +got):\n%s", tt.prefixes, diff)
			}
		})
	}
}

func TestExtractRejects(t *testing.T) {
	tests := []struct {
		name    string
		deb     func(t *testing.T) string
		wantErr error
	}{
		{"dotdot path", func(t *testing.T) string {
			return makeDeb(t, ".gz", []tarEntry{{name: "./../escape", body: "x", typ: tar.TypeReg}})
		}, errkind.InvalidArgument},
		{"absolute path", func(t *testing.T) string {
			return makeDeb(t, ".gz", []tarEntry{{name: "/tmp/escape", body: "x", typ: tar.TypeReg}})
		}, errkind.InvalidArgument},
		{"absolute symlink", func(t *testing.T) string {
			return makeDeb(t, ".gz", []tarEntry{{name: "./etc", link: "/etc", typ: tar.TypeSymlink}})
		}, errkind.InvalidArgument},
		{"escaping symlink", func(t *testing.T) string {
			return makeDeb(t, ".gz", []tarEntry{{name: "./a/b", link: "../../x", typ: tar.TypeSymlink}})
		}, errkind.InvalidArgument},
		{"escaping hard link", func(t *testing.T) string {
			return makeDeb(t, ".gz", []tarEntry{{name: "./a", link: "../x", typ: tar.TypeLink}})
		}, errkind.InvalidArgument},
		{"zstd data", func(t *testing.T) string { return makeDeb(t, ".zst", kernelLike) }, errkind.InvalidArgument},
		{"no data member", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x.deb")
			os.WriteFile(p, makeAr("debian-binary", "2.0\n"), 0o644)
			return p
		}, errkind.InvalidArgument},
		{"not ar", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x.deb")
			os.WriteFile(p, []byte("PK\x03\x04 not a deb"), 0o644)
			return p
		}, errkind.InvalidArgument},
		{"missing file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.deb") }, fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "out")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatalf("setup: %v", err)
			}
			err := Extract(t.Context(), tt.deb(t), dir)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Extract() = %v, want %v", err, tt.wantErr)
			}
			ents, err := os.ReadDir(parent)
			if err != nil {
				t.Fatalf("read %s: %v", parent, err)
			}
			if len(ents) != 1 {
				t.Errorf("Extract() wrote beside its directory: %v", ents)
			}
		})
	}
}

func TestArReaderOddSizes(t *testing.T) {
	ar := newArReader(bytes.NewReader(makeAr("a", "1", "bb", "22", "c", "333")))
	var got []string
	for {
		name, _, err := ar.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("next() = %v, want nil or io.EOF", err)
		}
		var b bytes.Buffer
		b.ReadFrom(ar)
		got = append(got, name+"="+b.String())
	}
	want := []string{"a=1", "bb=22", "c=333"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ar members mismatch (-want +got):\n%s", diff)
	}
}

func TestReadData(t *testing.T) {
	deb := makeDeb(t, ".xz", []tarEntry{
		{name: "./", typ: tar.TypeDir},
		{name: "./etc/", typ: tar.TypeDir},
		{name: "./etc/services", body: "http 80/tcp\n", typ: tar.TypeReg},
		{name: "./usr/share/zoneinfo/localtime", link: "/etc/localtime", typ: tar.TypeSymlink},
	})
	var got []string
	err := ReadData(t.Context(), deb, func(hdr *tar.Header, r io.Reader) error {
		b, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%c %s %q %s", hdr.Typeflag, hdr.Name, b, hdr.Linkname))
		return nil
	})
	if err != nil {
		t.Fatalf("ReadData() error = %v", err)
	}
	want := []string{
		`5 ./ "" `,
		`5 ./etc/ "" `,
		`0 ./etc/services "http 80/tcp\n" `,
		`2 ./usr/share/zoneinfo/localtime "" /etc/localtime`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadData() entries mismatch (-want +got):\n%s", diff)
	}

	stop := errors.New("stop")
	calls := 0
	err = ReadData(t.Context(), deb, func(*tar.Header, io.Reader) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("ReadData(fn failing) = %v after %d calls, want %v after 1", err, calls, stop)
	}
}
