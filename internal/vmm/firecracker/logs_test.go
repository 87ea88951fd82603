package firecracker

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/internal/testenv"
)

func TestCapLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "console.log")
	f, err := openLog(path, true)
	if err != nil {
		t.Fatalf("openLog: %v", err)
	}
	defer f.Close()
	f.WriteString(strings.Repeat("a", 60) + strings.Repeat("b", 40))

	if rotated, err := capLog(path, 100); err != nil || rotated {
		t.Errorf("capLog at the limit = %v, %v; want no rotation", rotated, err)
	}
	f.WriteString("c")
	if rotated, err := capLog(path, 100); err != nil || !rotated {
		t.Fatalf("capLog over the limit = %v, %v; want a rotation", rotated, err)
	}
	old, _ := os.ReadFile(filepath.Join(dir, "console.old.log"))
	if want := strings.Repeat("a", 59) + strings.Repeat("b", 40) + "c"; string(old) != want {
		t.Errorf("rotated log = %q, want the last 100 bytes %q", old, want)
	}
	// The writer appends, so it continues at the start of the emptied file.
	f.WriteString("d")
	if b, _ := os.ReadFile(path); string(b) != "d" {
		t.Errorf("log after rotation = %q, want %q", b, "d")
	}
	if rotated, err := capLog(filepath.Join(dir, "missing.log"), 1); err != nil || rotated {
		t.Errorf("capLog of a missing file = %v, %v", rotated, err)
	}
}

// TestLogKeeper copies what is written into the FIFO (as Firecracker's
// logger would, read-write and non-blocking) and caps the log.
func TestLogKeeper(t *testing.T) {
	dir := t.TempDir()
	fifo, out := filepath.Join(dir, "vmm.fifo"), filepath.Join(dir, "firecracker.log")
	if err := makeFIFO(fifo, -1, -1); err != nil {
		t.Fatalf("makeFIFO: %v", err)
	}
	k, err := startLogKeeper(slog.New(slog.DiscardHandler), fifo, out, []string{out}, 64, 5*time.Millisecond)
	if err != nil {
		t.Fatalf("startLogKeeper: %v", err)
	}
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open fifo: %v", err)
	}
	defer w.Close()
	w.WriteString("first line\n")
	testenv.Eventually(t, 5*time.Second, func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "first line\n"
	})
	w.WriteString(strings.Repeat("x", 100) + "\n")
	testenv.Eventually(t, 5*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(dir, "firecracker.old.log"))
		fi, _ := os.Stat(out)
		return err == nil && fi != nil && fi.Size() <= 64
	})
	w.WriteString("last words\n")
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if b, _ := os.ReadFile(out); !strings.HasSuffix(string(b), "last words\n") {
		t.Errorf("log after Close = %q, want the last line drained", b)
	}
}
