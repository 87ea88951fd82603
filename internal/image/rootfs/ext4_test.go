package rootfs

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/testenv"
)

func requireE2fsprogs(t *testing.T) {
	t.Helper()
	testenv.RequireTool(t, testenv.TierUnit, "mkfs.ext4", "e2fsprogs")
	testenv.RequireTool(t, testenv.TierUnit, "debugfs", "e2fsprogs")
}

// debugfs runs a read-only debugfs request on img and returns its output.
func debugfs(t *testing.T, img, request string) string {
	t.Helper()
	cmd := exec.Command("debugfs", "-R", request, img)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("debugfs -R %q %s: %v: %s", request, img, err, stderr.String())
	}
	return stdout.String()
}

// statField returns a field of debugfs's "stats" output, such as
// "Filesystem volume name".
func statField(t *testing.T, img, field string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `:\s*(.*)$`).FindStringSubmatch(debugfs(t, img, "stats"))
	if m == nil {
		t.Fatalf("debugfs stats of %s has no %q", img, field)
	}
	return strings.TrimSpace(m[1])
}

// lsNames parses "ls -l" output of debugfs into name → "mode uid gid size".
func lsNames(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// inode mode (links) uid gid size date time name
		if len(f) < 9 || f[len(f)-1] == "." || f[len(f)-1] == ".." {
			continue
		}
		m[f[len(f)-1]] = strings.Join([]string{f[1], f[3], f[4]}, " ")
	}
	return m
}

func writeTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	files := []struct {
		name string
		body string
		mode os.FileMode
	}{
		{"hello", "hello, ext4\n", 0o644},
		{"bin/tool", "#!/bin/sh\n", 0o755},
		{"etc/motd", strings.Repeat("x", 100000), 0o600},
	}
	for _, f := range files {
		p := filepath.Join(src, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := os.WriteFile(p, []byte(f.body), f.mode); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	if err := os.Symlink("hello", filepath.Join(src, "link")); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return src
}

func TestMakeExt4(t *testing.T) {
	requireE2fsprogs(t)
	src := writeTree(t)
	tests := []struct {
		name      string
		opts      Ext4Options
		wantLabel string
		wantSize  int64 // bytes, or 0 for computed
	}{
		{name: "computed size", opts: Ext4Options{Label: "space-root"}, wantLabel: "space-root"},
		{name: "explicit size", opts: Ext4Options{Size: 256 * mib}, wantLabel: "<none>", wantSize: 256 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "root.ext4")
			start := time.Now()
			if err := MakeExt4(t.Context(), src, img, tt.opts); err != nil {
				t.Fatalf("MakeExt4() error = %v", err)
			}
			t.Logf("MakeExt4 took %v", time.Since(start))
			fi, err := os.Stat(img)
			if err != nil {
				t.Fatalf("MakeExt4() made no image: %v", err)
			}
			wantSize := tt.wantSize
			if wantSize == 0 {
				wantSize = 64 * mib // the content is tiny
				if fi.Size() < wantSize || fi.Size() > wantSize+mib || fi.Size()%mib != 0 {
					t.Errorf("MakeExt4() image size = %d, want 64 MiB plus a little, in MiB", fi.Size())
				}
			} else if fi.Size() != wantSize {
				t.Errorf("MakeExt4() image size = %d, want %d", fi.Size(), wantSize)
			}
			if got := statField(t, img, "Filesystem volume name"); got != tt.wantLabel {
				t.Errorf("MakeExt4() label = %q, want %q", got, tt.wantLabel)
			}
			if got := statField(t, img, "Block size"); got != "4096" {
				t.Errorf("MakeExt4() block size = %s, want 4096", got)
			}
			uid, gid := strconv.Itoa(os.Getuid()), strconv.Itoa(os.Getgid())
			wantRoot := map[string]string{
				"bin":        "40755 " + uid + " " + gid,
				"etc":        "40755 " + uid + " " + gid,
				"hello":      "100644 " + uid + " " + gid,
				"link":       "120777 " + uid + " " + gid,
				"lost+found": "40700 0 0",
			}
			if diff := cmp.Diff(wantRoot, lsNames(debugfs(t, img, "ls -l /"))); diff != "" {
				t.Errorf("MakeExt4() root directory mismatch (-want +got):\n%s", diff)
			}
			if got := lsNames(debugfs(t, img, "ls -l /etc"))["motd"]; got != "100600 "+uid+" "+gid {
				t.Errorf("MakeExt4() /etc/motd = %q, want mode 100600", got)
			}
			for name, want := range map[string]string{"/hello": "hello, ext4\n", "/bin/tool": "#!/bin/sh\n", "/etc/motd": strings.Repeat("x", 100000)} {
				if got := debugfs(t, img, "cat "+name); got != want {
					t.Errorf("MakeExt4() %s holds %d bytes %.20q, want %d bytes %.20q", name, len(got), got, len(want), want)
				}
			}
			if got := debugfs(t, img, "stat /"); !strings.Contains(got, "User:     0   Group:     0") {
				t.Errorf("MakeExt4() root directory not owned by 0:0:\n%s", got)
			}
		})
	}
}

func itoa(n int) string { return strings.TrimSpace(strings.Repeat(" ", 0) + string(appendInt(nil, n))) }

func appendInt(b []byte, n int) []byte {
	if n >= 10 {
		b = appendInt(b, n/10)
	}
	return append(b, byte('0'+n%10))
}

func TestMakeExt4Errors(t *testing.T) {
	requireE2fsprogs(t)
	src := writeTree(t)
	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "blob"), bytes.Repeat([]byte{1}, 8*mib), 0o644); err != nil {
		t.Fatalf("setup: %v", err)
	}
	notDir := filepath.Join(src, "hello")
	tests := []struct {
		name    string
		src     string
		opts    Ext4Options
		wantErr error
	}{
		{"label too long", src, Ext4Options{Label: "a-label-longer-than-16"}, errkind.InvalidArgument},
		{"negative size", src, Ext4Options{Size: -1}, errkind.InvalidArgument},
		{"source not a directory", notDir, Ext4Options{}, errkind.InvalidArgument},
		{"missing source", filepath.Join(src, "nope"), Ext4Options{}, os.ErrNotExist},
		{"image too small", big, Ext4Options{Size: 4 * mib}, errkind.ResourceExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "root.ext4")
			err := MakeExt4(t.Context(), tt.src, img, tt.opts)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("MakeExt4() error = %v, want one wrapping %v", err, tt.wantErr)
			}
			if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("MakeExt4() failed but left %s (%v)", img, err)
			}
		})
	}
}

func TestCheckFree(t *testing.T) {
	dir := t.TempDir()
	if err := checkFree(dir, 1); err != nil {
		t.Errorf("checkFree(%s, 1) = %v, want nil", dir, err)
	}
	err := checkFree(dir, 1<<62)
	if !errors.Is(err, errkind.ResourceExhausted) || !strings.Contains(err.Error(), "no space left on "+dir) {
		t.Errorf("checkFree(%s, 4 EiB) = %v, want a %q error wrapping %v", dir, err, "no space left on "+dir, errkind.ResourceExhausted)
	}
}

func TestNoSpace(t *testing.T) {
	err := noSpace("/some/dir", &os.PathError{Op: "truncate", Path: "/some/dir/img", Err: syscall.ENOSPC})
	if !errors.Is(err, errkind.ResourceExhausted) || !errors.Is(err, syscall.ENOSPC) || !strings.HasPrefix(err.Error(), "no space left on /some/dir") {
		t.Errorf("noSpace(ENOSPC) = %v, want a %q error wrapping %v and ENOSPC", err, "no space left on /some/dir", errkind.ResourceExhausted)
	}
}

func TestLookToolMissing(t *testing.T) {
	_, err := lookTool("space-no-such-tool", "space-tools", t.TempDir())
	if !errors.Is(err, errkind.FailedPrecondition) || !strings.Contains(err.Error(), "apt package space-tools") {
		t.Errorf("lookTool(missing) = %v, want an error naming the apt package and wrapping %v", err, errkind.FailedPrecondition)
	}
}

func TestNewWritableLayer(t *testing.T) {
	requireE2fsprogs(t)
	img := filepath.Join(t.TempDir(), "rw.ext4")
	const size = 10 << 30
	start := time.Now()
	if err := NewWritableLayer(t.Context(), img, size); err != nil {
		t.Fatalf("NewWritableLayer() error = %v", err)
	}
	took := time.Since(start)
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatalf("NewWritableLayer() made no image: %v", err)
	}
	used := fi.Sys().(*syscall.Stat_t).Blocks * 512
	t.Logf("empty 10 GiB writable layer: %d bytes (%.1f MiB) on disk, made in %v", used, float64(used)/mib, took)
	if fi.Size() != size {
		t.Errorf("NewWritableLayer() size = %d, want %d", fi.Size(), size)
	}
	if used > 64*mib {
		t.Errorf("NewWritableLayer() uses %d bytes of disk, want under 64 MiB (sparse)", used)
	}
	if got := statField(t, img, "Filesystem volume name"); got != WritableLabel {
		t.Errorf("NewWritableLayer() label = %q, want %q", got, WritableLabel)
	}
	if got := statField(t, img, "Filesystem features"); !strings.Contains(got, "has_journal") {
		t.Errorf("NewWritableLayer() features = %q, want a journal", got)
	}

	if err := NewWritableLayer(t.Context(), img, 1<<20); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("NewWritableLayer(1 MiB) error = %v, want one wrapping %v", err, errkind.InvalidArgument)
	}
}
