package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newBox(t *testing.T) *Box {
	t.Helper()
	b, err := New(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatalf("setup: New: %v", err)
	}
	return b
}

func TestSealOpen(t *testing.T) {
	b := newBox(t)
	for _, value := range [][]byte{[]byte("ghp_token"), {0}, bytes.Repeat([]byte("x"), 64<<10)} {
		sealed := b.Seal("t1", "github", value)
		if len(sealed) != len(value)+Overhead {
			t.Errorf("Seal(%d bytes) = %d bytes, want %d", len(value), len(sealed), len(value)+Overhead)
		}
		// A short value turns up in random bytes by chance (one byte: in
		// about one seal of nine), a long one only if it was not sealed.
		if len(value) >= 8 && bytes.Contains(sealed, value) {
			t.Errorf("Seal(%.20q) contains the value", value)
		}
		got, err := b.Open("t1", "github", sealed)
		if err != nil || !bytes.Equal(got, value) {
			t.Errorf("Open(Seal(%.20q)) = %.20q, %v; want the value", value, got, err)
		}
	}
	// A fresh nonce each time: the same value seals differently.
	if a, c := b.Seal("t1", "github", []byte("v")), b.Seal("t1", "github", []byte("v")); bytes.Equal(a, c) {
		t.Errorf("Seal twice = %x both times, want different nonces", a)
	}
}

func TestOpenRefuses(t *testing.T) {
	b := newBox(t)
	sealed := b.Seal("t1", "github", []byte("ghp_token"))
	other, err := New(bytes.Repeat([]byte{8}, KeySize))
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	flip := func(i int) []byte {
		c := bytes.Clone(sealed)
		c[i] ^= 1
		return c
	}
	tests := []struct {
		name         string
		box          *Box
		team, secret string
		sealed       []byte
	}{
		{"other team", b, "t2", "github", sealed},
		{"other name", b, "t1", "gitlab", sealed},
		// Length prefixes keep the boundary between team and name.
		{"boundary moved", b, "t1g", "ithub", sealed},
		{"other key", other, "t1", "github", sealed},
		{"nonce flipped", b, "t1", "github", flip(0)},
		{"ciphertext flipped", b, "t1", "github", flip(nonceSize)},
		{"tag flipped", b, "t1", "github", flip(len(sealed) - 1)},
		{"truncated", b, "t1", "github", sealed[:len(sealed)-1]},
		{"shorter than overhead", b, "t1", "github", sealed[:Overhead-1]},
		{"empty", b, "t1", "github", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.box.Open(tt.team, tt.secret, tt.sealed)
			if !errors.Is(err, ErrNotAuthentic) || got != nil {
				t.Errorf("Open(%s, %s) = %q, %v; want ErrNotAuthentic", tt.team, tt.secret, got, err)
			}
		})
	}
}

func TestNewKeySize(t *testing.T) {
	for _, n := range []int{0, 16, 31, 33} {
		if _, err := New(make([]byte, n)); err == nil {
			t.Errorf("New(%d-byte key) = nil error, want error", n)
		}
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.key")
	b, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("LoadOrCreateKey(new) = %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat key: %v", err)
	}
	if fi.Mode() != 0o600 || fi.Size() != KeySize {
		t.Errorf("key file = mode %v, %d bytes; want -rw------- and %d bytes", fi.Mode(), fi.Size(), KeySize)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("dir holds %d entries after create, want only the key (no temporary file left)", len(entries))
	}
	sealed := b.Seal("t1", "github", []byte("v"))
	again, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("LoadOrCreateKey(existing) = %v", err)
	}
	if got, err := again.Open("t1", "github", sealed); err != nil || string(got) != "v" {
		t.Errorf("Open with the reloaded key = %q, %v; want \"v\"", got, err)
	}
	if other, err := LoadOrCreateKey(filepath.Join(dir, "other.key")); err != nil {
		t.Fatalf("LoadOrCreateKey(other) = %v", err)
	} else if _, err := other.Open("t1", "github", sealed); err == nil {
		t.Errorf("a second new key opens the first one's value, want a different random key")
	}
}

func TestLoadOrCreateKeyRefuses(t *testing.T) {
	write := func(b []byte, mode os.FileMode) func(string) error {
		return func(p string) error {
			if err := os.WriteFile(p, b, 0o600); err != nil {
				return err
			}
			return os.Chmod(p, mode) // not narrowed by the umask
		}
	}
	tests := []struct {
		name    string
		setup   func(path string) error
		wantErr string
	}{
		{"group readable", write(make([]byte, KeySize), 0o640), "chmod 600"},
		{"world readable", write(make([]byte, KeySize), 0o604), "chmod 600"},
		{"group writable", write(make([]byte, KeySize), 0o620), "chmod 600"},
		{"too short", write(make([]byte, KeySize-1), 0o600), "31 bytes, want 32"},
		{"too long", write(make([]byte, KeySize+1), 0o600), "33 bytes, want 32"},
		{"hex text", write([]byte(strings.Repeat("ab", KeySize)+"\n"), 0o600), "65 bytes"},
		{"empty", write(nil, 0o600), "0 bytes"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, "not a regular file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "secrets.key")
			if err := tt.setup(path); err != nil {
				t.Fatalf("setup: %v", err)
			}
			before, _ := os.ReadFile(path)
			b, err := LoadOrCreateKey(path)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) {
				t.Errorf("LoadOrCreateKey(%s) = %v, %v; want an error naming the file and containing %q", tt.name, b, err, tt.wantErr)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Errorf("LoadOrCreateKey(%s) changed the file", tt.name)
			}
		})
	}
}
