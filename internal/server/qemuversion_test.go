package server

import (
	"os"
	"path/filepath"
	"testing"
)

func TestQEMUVersion(t *testing.T) {
	tests := []struct {
		name, out, want string
		ok              bool
	}{
		{"debian", "QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)\nCopyright (c) 2003-2022 Fabrice Bellard\n", "7.2.19", true},
		{"plain", "QEMU emulator version 9.1.0\n", "9.1.0", true},
		{"garbage", "hello\n", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "qemu")
			if err := os.WriteFile(bin, []byte("#!/bin/sh\nprintf '%s' '"+tt.out+"'\n"), 0o755); err != nil {
				t.Fatalf("setup: %v", err)
			}
			got, err := qemuVersion(t.Context(), bin)
			if got != tt.want || (err == nil) != tt.ok {
				t.Errorf("qemuVersion(%q) = %q, %v; want %q, ok %v", tt.out, got, err, tt.want, tt.ok)
			}
		})
	}
}
