package cpio

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

func writeAll(t *testing.T, entries []Entry) []byte {
	t.Helper()
	var b bytes.Buffer
	w := NewWriter(&b)
	for _, e := range entries {
		if err := w.Add(e); err != nil {
			t.Fatalf("Add(%s) = %v", e.Name, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	return b.Bytes()
}

func readAll(r io.Reader) ([]Entry, error) {
	cr := NewReader(r)
	var got []Entry
	for {
		e, err := cr.Next()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, e)
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		entries []Entry
	}{
		{"empty", nil},
		{"initramfs-like", []Entry{
			{Name: "dev", Mode: fs.ModeDir | 0o755},
			{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1},
			{Name: "dev/vda", Mode: fs.ModeDevice | 0o660, Major: 254, Minor: 0},
			{Name: "init", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
			{Name: "lib", Mode: fs.ModeDir | 0o755},
			{Name: "lib/sh", Mode: fs.ModeSymlink | 0o777, Data: []byte("../bin/sh")},
			{Name: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
			{Name: "bin/su", Mode: fs.ModeSetuid | fs.ModeSetgid | 0o755, Data: []byte{0}},
		}},
		{"every padding", []Entry{
			{Name: "a", Mode: 0o644, Data: []byte("1")},
			{Name: "ab", Mode: 0o644, Data: []byte("12")},
			{Name: "abc", Mode: 0o644, Data: []byte("123")},
			{Name: "abcd", Mode: 0o644, Data: []byte("1234")},
			{Name: "abcde", Mode: 0o644, Data: []byte("12345")},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			archive := writeAll(t, tt.entries)
			if len(archive)%4 != 0 {
				t.Errorf("archive length %d, want a multiple of 4", len(archive))
			}
			got, err := readAll(bytes.NewReader(archive))
			if err != nil {
				t.Fatalf("read back = %v", err)
			}
			if diff := cmp.Diff(tt.entries, got); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s", diff)
			}
			if again := writeAll(t, tt.entries); !bytes.Equal(archive, again) {
				t.Errorf("writing the same entries twice gave different bytes")
			}
		})
	}
}

func TestWriteFormat(t *testing.T) {
	got := string(writeAll(t, []Entry{{Name: "/dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, Major: 5, Minor: 1}}))
	want := "070701" + "00000001" + "00002180" + "00000000" + "00000000" + "00000001" + "00000000" +
		"00000000" + "00000000" + "00000000" + "00000005" + "00000001" + "0000000c" + "00000000" +
		"dev/console\x00" + // 110+12 = 122 bytes: pad to 124
		"\x00\x00" +
		"070701" + "00000000" + "00000000" + "00000000" + "00000000" + "00000001" + "00000000" +
		"00000000" + "00000000" + "00000000" + "00000000" + "00000000" + "0000000b" + "00000000" +
		"TRAILER!!!\x00" + "\x00\x00\x00"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("archive bytes mismatch (-want +got):\n%s", diff)
	}
}

func TestAddRejects(t *testing.T) {
	tests := []struct {
		name string
		e    Entry
	}{
		{"empty name", Entry{Name: "/", Mode: fs.ModeDir}},
		{"trailer name", Entry{Name: "TRAILER!!!"}},
		{"socket", Entry{Name: "s", Mode: fs.ModeSocket}},
		{"dir with data", Entry{Name: "d", Mode: fs.ModeDir, Data: []byte("x")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := NewWriter(io.Discard).Add(tt.e); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("Add(%+v) = %v, want InvalidArgument", tt.e, err)
			}
		})
	}
}

func TestReadMalformed(t *testing.T) {
	good := writeAll(t, []Entry{{Name: "init", Mode: 0o755, Data: []byte("agent")}})
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("070707"), good[6:]...)},
		{"truncated data", good[:120]},
		{"no trailer", good[:len(good)-124]},
		{"bad hex", append([]byte("070701zz"), good[8:]...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := readAll(bytes.NewReader(tt.in)); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("read(%s) = %v, want InvalidArgument", tt.name, err)
			}
		})
	}
}
