package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCappedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	w := newCappedFile(f, 10)
	for _, s := range []string{"hello", " wor", "ld and more", "!"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Errorf("Write(%q) = %d, %v, want %d, nil", s, n, err, len(s))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "hello worl"; got != want {
		t.Errorf("file = %q, want %q", got, want)
	}
	if got, want := w.Dropped(), int64(len("hello world and more!")-10); got != want {
		t.Errorf("Dropped() = %d, want %d", got, want)
	}

	b, err = tail(path, 4)
	if err != nil || string(b) != "worl" {
		t.Errorf("tail(path, 4) = %q, %v, want %q", b, err, "worl")
	}
	b, err = tail(path, 100)
	if err != nil || string(b) != "hello worl" {
		t.Errorf("tail(path, 100) = %q, %v, want the whole file", b, err)
	}
}

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tqemu-system-x86\nVmPeak:\t  999 kB\nVmRSS:\t   264128 kB\nThreads:\t5\n"
	rss, ok, err := parseVmRSS([]byte(status))
	if err != nil || !ok || rss != 264128*1024 {
		t.Errorf("parseVmRSS() = %d, %v, %v, want %d, true, nil", rss, ok, err, 264128*1024)
	}
	_, ok, err = parseVmRSS([]byte("Name:\tzombie\nState:\tZ (zombie)\n"))
	if ok || err != nil {
		t.Errorf("parseVmRSS(zombie) = _, %v, %v, want false, nil", ok, err)
	}
	if _, _, err := parseVmRSS([]byte("VmRSS:\t12 MB\n")); err == nil {
		t.Error("parseVmRSS(bad unit) = nil error, want error")
	}

	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if rss, ok, err := parseVmRSS(b); err != nil || !ok || rss <= 0 {
		t.Errorf("parseVmRSS(/proc/self/status) = %d, %v, %v, want positive", rss, ok, err)
	}
}

func TestParseCPUTime(t *testing.T) {
	// Fields: pid (comm) state ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime stime ...
	stat := "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 5 0\n"
	got, err := parseCPUTime([]byte(stat))
	if want := 3250 * time.Millisecond; err != nil || got != want {
		t.Errorf("parseCPUTime() = %v, %v, want %v, nil", got, err, want)
	}
	if _, err := parseCPUTime([]byte("4242 (short) S 1 2")); err == nil {
		t.Error("parseCPUTime(truncated) = nil error, want error")
	}

	// Burn a little CPU so our own time is non-zero.
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		_ = strings.Repeat("x", 1000)
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if got, err := parseCPUTime(b); err != nil || got <= 0 {
		t.Errorf("parseCPUTime(/proc/self/stat) = %v, %v, want positive", got, err)
	}
}
