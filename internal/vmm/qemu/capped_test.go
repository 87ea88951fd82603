package qemu

import (
	"os"
	"path/filepath"
	"testing"
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
