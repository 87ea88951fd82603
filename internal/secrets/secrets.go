// Package secrets seals team secrets for storage with AES-256-GCM, under a
// key kept in a file of its own, outside the database.
//
// A sealed value is a random 12-byte nonce followed by the GCM ciphertext
// and tag. Its owner (a team, or whatever record holds it) and name are
// authenticated with it, so a sealed value copied into another owner's or
// another name's record does not open.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// KeySize is the size of a key: AES-256.
const KeySize = 32

// Overhead is how many bytes sealing adds to a value: the nonce and the
// authentication tag.
const Overhead = nonceSize + tagSize

const (
	nonceSize = 12
	tagSize   = 16
)

// ErrNotAuthentic is returned by [Box.Open] when a sealed value does not
// open: it was sealed under another key or for another owner or name, or
// it was altered.
var ErrNotAuthentic = errors.New("sealed value does not authenticate (another key, owner or name, or altered)")

// Box seals and opens values under one key. It is safe for concurrent use.
type Box struct {
	aead cipher.AEAD // set by New, never changed
}

// New returns a Box sealing under key, which must be KeySize bytes. The
// Box keeps no reference to key.
func New(key []byte) (*Box, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("secrets key is %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// Seal returns value sealed for the secret name of owner (a team ID, or the
// ID of another record that holds it): Overhead bytes longer than value.
func (b *Box) Seal(owner, name string, value []byte) []byte {
	out := make([]byte, nonceSize, nonceSize+len(value)+tagSize)
	rand.Read(out) // never fails (crypto/rand crashes the program instead)
	return b.aead.Seal(out, out, value, additionalData(owner, name))
}

// Open returns the value sealed in sealed for owner's secret name, or
// an error wrapping ErrNotAuthentic.
func (b *Box) Open(owner, name string, sealed []byte) ([]byte, error) {
	if len(sealed) < Overhead {
		return nil, fmt.Errorf("open secret %s/%s: %d bytes, shorter than nonce and tag: %w", owner, name, len(sealed), ErrNotAuthentic)
	}
	value, err := b.aead.Open(nil, sealed[:nonceSize], sealed[nonceSize:], additionalData(owner, name))
	if err != nil {
		return nil, fmt.Errorf("open secret %s/%s: %w", owner, name, ErrNotAuthentic)
	}
	return value, nil
}

// additionalData binds a sealed value to its record: a label and the
// length-prefixed owner and name, so no two (owner, name) pairs share it.
func additionalData(owner, name string) []byte {
	ad := []byte("space secret v1\x00")
	ad = binary.AppendUvarint(ad, uint64(len(owner)))
	ad = append(ad, owner...)
	ad = binary.AppendUvarint(ad, uint64(len(name)))
	return append(ad, name...)
}

// LoadOrCreateKey returns a Box sealing under the key in the file at path,
// first writing a new random key there (mode 0600, atomically and synced)
// if the file does not exist. It refuses a file that is not a regular file
// of exactly KeySize bytes, or that its group or others may access.
//
// Losing the file makes every sealed value unreadable; keep it out of the
// database and its backups' reach, but back it up.
func LoadOrCreateKey(path string) (*Box, error) {
	key, err := readKey(path)
	if errors.Is(err, os.ErrNotExist) {
		key, err = createKey(path)
	}
	if err != nil {
		return nil, err
	}
	return New(key)
}

// readKey reads and checks the key file at path.
func readKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("secrets key %s is not a regular file (%s)", path, fi.Mode().Type())
	case fi.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("secrets key %s has mode %#o, which lets group or others read it: chmod 600 it", path, fi.Mode().Perm())
	case fi.Size() != KeySize:
		return nil, fmt.Errorf("secrets key %s is %d bytes, want %d: it is not a key this server wrote", path, fi.Size(), KeySize)
	}
	key := make([]byte, KeySize)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("read secrets key %s: %w", path, err)
	}
	return key, nil
}

// createKey writes a new random key to path unless a file is there by
// then, and returns the key now at path. The file appears complete or not
// at all: the key is written and synced to a temporary file first, then
// linked into place (which, unlike a rename, never replaces another
// process's key).
func createKey(path string) ([]byte, error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("create secrets key: %w", err)
	}
	defer os.Remove(tmp.Name())
	key := make([]byte, KeySize)
	rand.Read(key)
	_, err = tmp.Write(key)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("write secrets key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, os.ErrExist) {
		return readKey(path) // another process made one first
	} else if err != nil {
		return nil, fmt.Errorf("create secrets key: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return nil, fmt.Errorf("sync secrets key directory: %w", err)
	}
	return key, nil
}

// syncDir makes a new directory entry in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
