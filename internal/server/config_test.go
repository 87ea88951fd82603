package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/internal/errkind"
)

// TestRunRefusesBadSettings checks a bad default checkpoint policy or
// chunk GC interval fails the start before anything is made.
func TestRunRefusesBadSettings(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		says string
	}{
		{"negative every", Config{DefaultCheckpoints: &api.CheckpointPolicy{Every: "-5s"}}, "default checkpoint policy.every: -5s is negative"},
		{"keep too many", Config{DefaultCheckpoints: &api.CheckpointPolicy{AfterExec: true, Keep: 5000}}, "default checkpoint policy.keep"},
		{"negative gc interval", Config{ChunkGCInterval: -time.Minute}, "chunk garbage collection interval -1m0s is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := tt.cfg
			cfg.DataDir, cfg.CacheBase, cfg.VMM, cfg.Listen = filepath.Join(dir, "data"), dir, VMMFake, "127.0.0.1:0"
			err := Run(t.Context(), cfg)
			if !errors.Is(err, errkind.InvalidArgument) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("Run(%s) = %v, want an invalid argument saying %q", tt.name, err, tt.says)
			}
			if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("Run(%s) failed but made its data dir (%v)", tt.name, err)
			}
		})
	}
}
