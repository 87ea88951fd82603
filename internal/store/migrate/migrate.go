// Package migrate reads numbered SQL schema migrations from a file system.
//
// A migration file is named NNNN_description.sql, where NNNN is its version
// (1, 2, ...; leading zeros optional). Backends apply the versions newer than
// the newest one recorded in their schema_migrations table, in one
// transaction, and record each.
package migrate

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one schema step.
type Migration struct {
	Version int64
	Name    string // file name
	SQL     string
}

// Load returns the migrations in dir of fsys, ordered by version. Versions
// must be unique and start at 1 without gaps.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and _", name)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration: %w", err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != int64(i+1) {
			return nil, fmt.Errorf("migration %s: version %d, want %d (versions must be 1, 2, ... without gaps or repeats)", m.Name, m.Version, i+1)
		}
	}
	return ms, nil
}

// Pending returns the migrations after version applied. It fails if applied
// is newer than every migration known here: the schema was written by a newer
// binary.
func Pending(ms []Migration, applied int64) ([]Migration, error) {
	if applied > int64(len(ms)) {
		return nil, fmt.Errorf("schema version %d is newer than this binary's %d", applied, len(ms))
	}
	return ms[applied:], nil
}
