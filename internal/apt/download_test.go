package apt

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/testenv"
)

const helloStanza = `Package: hello
Version: 2.10-3
Installed-Size: 281
Depends: libc6 (>= 2.34),
 libfoo1 | libbar2:any (>= 1)
Description: example package based on GNU hello
 The GNU hello program produces a familiar, friendly greeting.
Filename: pool/main/h/hello/hello_2.10-3_amd64.deb
Size: 5
SHA256: %SHA%

`

func TestParseStanza(t *testing.T) {
	out := "Package: other\nVersion: 1\n\n" + strings.ReplaceAll(helloStanza, "%SHA%", "ABCDEF")
	got, ok := parseStanza([]byte(out), "hello")
	want := Package{
		Name:     "hello",
		Version:  "2.10-3",
		Filename: "pool/main/h/hello/hello_2.10-3_amd64.deb",
		Size:     5,
		SHA256:   "abcdef",
		Depends:  "libc6 (>= 2.34), libfoo1 | libbar2:any (>= 1)",
	}
	if !ok {
		t.Fatalf("parseStanza(hello) found nothing")
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseStanza(hello) mismatch (-want +got):\n%s", diff)
	}
	if _, ok := parseStanza([]byte(out), "absent"); ok {
		t.Errorf("parseStanza(absent) found a stanza, want none")
	}
}

func TestDependNames(t *testing.T) {
	got := dependNames("linux-image-6.1.0-57-cloud-amd64 (= 6.1.192-3), a | b:any (>= 1),c")
	want := []string{"linux-image-6.1.0-57-cloud-amd64", "a", "b", "c"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dependNames mismatch (-want +got):\n%s", diff)
	}
}

func TestStripNumeric(t *testing.T) {
	tests := []struct{ in, want string }{
		{"linux-image-6.1.0-57-cloud-amd64", "linux-image-cloud-amd64"},
		{"linux-image-cloud-amd64", "linux-image-cloud-amd64"},
		{"linux-image-6.1.0-57-amd64", "linux-image-amd64"},
		{"kmod", "kmod"},
	}
	for _, tt := range tests {
		if got := stripNumeric(tt.in); got != tt.want {
			t.Errorf("stripNumeric(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// fakeApt puts fake apt-cache and apt-get scripts first on PATH. apt-cache
// knows only "hello" (with the digest of "good\n"); apt-get runs getBody.
func fakeApt(t *testing.T, getBody string) {
	t.Helper()
	sum := sha256.Sum256([]byte("good\n"))
	stanza := strings.ReplaceAll(helloStanza, "%SHA%", hex.EncodeToString(sum[:]))
	bin := t.TempDir()
	scripts := map[string]string{
		"apt-cache": "#!/bin/sh\nfor last; do :; done\nif [ \"$last\" = hello ]; then cat <<'EOF'\n" + stanza +
			"EOF\nelse echo 'E: No packages found' >&2; exit 100; fi\n",
		"apt-get": "#!/bin/sh\n" + getBody + "\n",
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func TestDownload(t *testing.T) {
	const file = "hello_2.10-3_amd64.deb"
	tests := []struct {
		name     string
		pkg      string
		getBody  string
		wantErr  error
		wantFile bool
	}{
		{"ok", "hello", "printf 'good\\n' > " + file, nil, true},
		{"corrupt", "hello", "printf 'evil\\n' > " + file, ErrCorrupt, false},
		{"disk full", "hello", "printf 'go' > " + file + "; echo 'E: Write error - write (28: No space left on device)' >&2; exit 100",
			errkind.ResourceExhausted, false},
		{"vanished from index", "hello", "echo \"E: Version '2.10-3' for 'hello' was not found\" >&2; exit 100", errkind.NotFound, false},
		{"unknown package", "nosuch", "exit 1", errkind.NotFound, false},
		{"no file written", "hello", "exit 0", errkind.Internal, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fakeApt(t, tt.getBody)
			dir := t.TempDir()
			p, err := Download(t.Context(), tt.pkg, dir)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Download(%s) = %v, want %v", tt.pkg, err, tt.wantErr)
			}
			_, statErr := os.Stat(filepath.Join(dir, file))
			if gotFile := statErr == nil; gotFile != tt.wantFile {
				t.Errorf("after Download(%s): file exists = %v, want %v", tt.pkg, gotFile, tt.wantFile)
			}
			if tt.wantFile && p.Path != filepath.Join(dir, file) {
				t.Errorf("Download(%s).Path = %q, want %q", tt.pkg, p.Path, filepath.Join(dir, file))
			}
		})
	}
}

func TestDownloadWithoutApt(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Download(t.Context(), "hello", t.TempDir())
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), `apt package "apt"`) {
		t.Errorf("Download without apt tools = %v, want FailedPrecondition naming package apt", err)
	}
}

func TestResolveHost(t *testing.T) {
	testenv.RequireTool(t, testenv.TierUnit, "apt-cache", "apt")
	got, err := Resolve(t.Context(), "linux-image-cloud-amd64")
	if err != nil {
		t.Fatalf("Resolve(linux-image-cloud-amd64) = %v", err)
	}
	if !regexp.MustCompile(`^linux-image-\d+\.\d+\.\d+-\d+-cloud-amd64$`).MatchString(got) {
		t.Errorf("Resolve(linux-image-cloud-amd64) = %q, want linux-image-<version>-cloud-amd64", got)
	}
	if again, err := Resolve(t.Context(), got); err != nil || again != got {
		t.Errorf("Resolve(%s) = %q, %v; want it unchanged", got, again, err)
	}
	if _, err := Lookup(t.Context(), "space-no-such-package"); !errors.Is(err, errkind.NotFound) {
		t.Errorf("Lookup(space-no-such-package) = %v, want NotFound", err)
	}
}

func TestDownloadHost(t *testing.T) {
	testenv.RequireSlow(t)
	testenv.RequireTool(t, testenv.TierSlow, "apt-get", "apt")
	dir := t.TempDir()
	p, err := Download(t.Context(), "hello", dir)
	if err != nil {
		t.Fatalf("Download(hello) = %v", err)
	}
	if err := Extract(t.Context(), p.Path, dir, "usr/bin/"); err != nil {
		t.Fatalf("Extract(%s) = %v", p.Path, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "usr/bin/hello")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("extracted usr/bin/hello: %v, %v; want an executable", fi, err)
	}
}
