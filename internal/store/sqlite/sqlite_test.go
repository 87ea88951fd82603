package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"space/internal/store"
	"space/internal/store/sqlite"
	"space/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) string { return filepath.Join(t.TempDir(), "state.db") },
		Open: func(ctx context.Context, path string) (store.Store, error) {
			return sqlite.Open(ctx, path)
		},
	})
}
