package main

import (
	"errors"
	"testing"
)

func TestRunUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no verb", nil},
		{"unknown verb", []string{"bogus"}},
		{"unknown global flag", []string{"--bogus", "version"}},
		{"version with an argument", []string{"version", "x"}},
		{"image without a verb", []string{"image"}},
		{"unknown image verb", []string{"image", "bogus"}},
		{"image kernel with an argument", []string{"image", "kernel", "x"}},
		{"rootfs with two sources", []string{"image", "rootfs", "--dir", "d", "--oci", "o", "--out", "x"}},
		{"rootfs --dir without --out", []string{"image", "rootfs", "--dir", "d"}},
		{"empty cache dir", []string{"--cache", "", "image", "kernel"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ue usageError
			if err := run(t.Context(), tt.args); !errors.As(err, &ue) {
				t.Errorf("run(%q) = %v, want a usage error", tt.args, err)
			}
		})
	}
}

func TestRunVersion(t *testing.T) {
	if err := run(t.Context(), []string{"version"}); err != nil {
		t.Errorf("run(version) = %v, want nil", err)
	}
}
