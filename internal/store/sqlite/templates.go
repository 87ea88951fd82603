package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"space/internal/store"
)

const templateColumns = `team_id, name, version, state, cache_key, snapshot_id, meta, created_us, updated_us, rev`

func scanTemplate(sc interface{ Scan(...any) error }) (store.Template, error) {
	var (
		t                store.Template
		meta             []byte // scanned as []byte: database/sql copies it
		created, updated int64
	)
	if err := sc.Scan(&t.TeamID, &t.Name, &t.Version, &t.State, &t.Key, &t.SnapshotID, &meta,
		&created, &updated, &t.Rev); err != nil {
		return store.Template{}, err
	}
	t.Meta = meta
	t.Created, t.Updated = fromMicros(created), fromMicros(updated)
	return t, nil
}

func (s *Store) queryTemplates(ctx context.Context, query string, args ...any) ([]store.Template, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+templateColumns+` FROM templates `+query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ts []store.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

// checkTemplateRef checks the name and version a lookup names; version 0 is
// allowed only if latestOK.
func checkTemplateRef(name string, version int, latestOK bool) error {
	if !store.ValidTemplateName(name) {
		return fmt.Errorf("template name %q: %w", name, store.ErrInvalid)
	}
	if version < 0 || version == 0 && !latestOK {
		return fmt.Errorf("template %s: version %d: %w", name, version, store.ErrInvalid)
	}
	return nil
}

// templateRef names version of template name in errors: "base:3", or
// "base:ready" for the latest ready version.
func templateRef(name string, version int) string {
	if version == 0 {
		return name + ":ready"
	}
	return fmt.Sprintf("%s:%d", name, version)
}

// CreateTemplate implements [store.Templates].
func (s *Store) CreateTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	if err := t.Validate(); err != nil {
		return store.Template{}, fmt.Errorf("create template: %w", err)
	}
	t.Meta = cloneJSON(t.Meta)
	t.Created = store.StoredTime(time.Now())
	t.Updated = t.Created
	t.Rev = 1
	err := s.write(ctx, func(tx *sql.Tx) error {
		// The counter row outlives the versions, so numbers are never reused.
		err := tx.QueryRowContext(ctx, `INSERT INTO template_names (team_id, name, last_version) VALUES (?, ?, 1)
			ON CONFLICT (team_id, name) DO UPDATE SET last_version = last_version + 1
			RETURNING last_version`, t.TeamID, t.Name).Scan(&t.Version)
		if err != nil {
			return mapErr(err, "team "+t.TeamID)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO templates (`+templateColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			t.TeamID, t.Name, t.Version, t.State, t.Key, t.SnapshotID, nullBytes(t.Meta),
			micros(t.Created), micros(t.Updated), t.Rev)
		return mapErr(err, "team "+t.TeamID)
	})
	if err != nil {
		return store.Template{}, fmt.Errorf("create template %s: %w", t.Name, err)
	}
	return t, nil
}

// Template implements [store.Templates].
func (s *Store) Template(ctx context.Context, teamID, name string, version int) (store.Template, error) {
	if err := checkTemplateRef(name, version, true); err != nil {
		return store.Template{}, err
	}
	var row *sql.Row
	if version == 0 {
		row = s.r.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE team_id = ? AND name = ? AND state = ? ORDER BY version DESC LIMIT 1`, teamID, name, store.TemplateReady)
	} else {
		row = s.r.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE team_id = ? AND name = ? AND version = ?`, teamID, name, version)
	}
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Template{}, fmt.Errorf("template %s: %w", templateRef(name, version), err)
	}
	return t, nil
}

// ListTemplates implements [store.Templates].
func (s *Store) ListTemplates(ctx context.Context, teamID, name string) ([]store.Template, error) {
	if name != "" && !store.ValidTemplateName(name) {
		return nil, fmt.Errorf("list templates of %s: name %q: %w", teamID, name, store.ErrInvalid)
	}
	query, args := `WHERE team_id = ?`, []any{teamID}
	if name != "" {
		query, args = query+` AND name = ?`, append(args, name)
	}
	ts, err := s.queryTemplates(ctx, query+` ORDER BY name, version`, args...)
	if err != nil {
		return nil, fmt.Errorf("list templates of %s: %w", teamID, err)
	}
	return ts, nil
}

// UpdateTemplate implements [store.Templates].
func (s *Store) UpdateTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	return s.updateTemplate(ctx, nil, t)
}

// updateTemplate is UpdateTemplate, fenced by fence unless it is nil.
func (s *Store) updateTemplate(ctx context.Context, fence *store.Lease, t store.Template) (store.Template, error) {
	if err := t.Validate(); err != nil {
		return store.Template{}, fmt.Errorf("update template: %w", err)
	}
	if err := checkTemplateRef(t.Name, t.Version, false); err != nil {
		return store.Template{}, fmt.Errorf("update template: %w", err)
	}
	updated := store.StoredTime(time.Now())
	var out store.Template
	err := s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		var err error
		out, err = scanTemplate(tx.QueryRowContext(ctx, `UPDATE templates
			SET state = ?, cache_key = ?, snapshot_id = ?, meta = ?, updated_us = ?, rev = rev + 1
			WHERE team_id = ? AND name = ? AND version = ? AND rev = ?
			RETURNING `+templateColumns,
			t.State, t.Key, t.SnapshotID, nullBytes(t.Meta), micros(updated),
			t.TeamID, t.Name, t.Version, t.Rev))
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM templates WHERE team_id = ? AND name = ? AND version = ?`,
			t.TeamID, t.Name, t.Version).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return fmt.Errorf("at rev %d: %w", t.Rev, store.ErrVersionConflict)
	})
	if err != nil {
		return store.Template{}, fmt.Errorf("update template %s: %w", templateRef(t.Name, t.Version), err)
	}
	return out, nil
}

// DeleteTemplate implements [store.Templates].
func (s *Store) DeleteTemplate(ctx context.Context, teamID, name string, version int) error {
	if err := checkTemplateRef(name, version, false); err != nil {
		return fmt.Errorf("delete template: %w", err)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM templates WHERE team_id = ? AND name = ? AND version = ?`,
			teamID, name, version))
	})
	if err != nil {
		return fmt.Errorf("delete template %s: %w", templateRef(name, version), err)
	}
	return nil
}

// UnsettledTemplates implements [store.TemplateIndex].
func (s *Store) UnsettledTemplates(ctx context.Context) ([]store.Template, error) {
	ts, err := s.queryTemplates(ctx, `WHERE state IN (?, ?) ORDER BY created_us, team_id, name, version`,
		store.TemplateBuilding, store.TemplateDeleting)
	if err != nil {
		return nil, fmt.Errorf("unsettled templates: %w", err)
	}
	return ts, nil
}

const buildCacheColumns = `team_id, cache_key, snapshot_id, created_us`

func scanBuildCache(sc interface{ Scan(...any) error }) (store.BuildCacheEntry, error) {
	var (
		e       store.BuildCacheEntry
		created int64
	)
	if err := sc.Scan(&e.TeamID, &e.Key, &e.SnapshotID, &created); err != nil {
		return store.BuildCacheEntry{}, err
	}
	e.Created = fromMicros(created)
	return e, nil
}

// PutBuildCache implements [store.Templates].
func (s *Store) PutBuildCache(ctx context.Context, e store.BuildCacheEntry) (store.BuildCacheEntry, error) {
	if err := e.Validate(); err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("put build cache: %w", err)
	}
	e.Created = store.StoredTime(time.Now())
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO build_cache (`+buildCacheColumns+`) VALUES (?, ?, ?, ?)`,
			e.TeamID, e.Key, e.SnapshotID, micros(e.Created))
		return mapErr(err, "team "+e.TeamID)
	})
	if err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("put build cache %s: %w", e.Key, err)
	}
	return e, nil
}

// BuildCache implements [store.Templates].
func (s *Store) BuildCache(ctx context.Context, teamID, key string) (store.BuildCacheEntry, error) {
	if !store.ValidCacheKey(key) {
		return store.BuildCacheEntry{}, fmt.Errorf("build cache: key %q: %w", key, store.ErrInvalid)
	}
	e, err := scanBuildCache(s.r.QueryRowContext(ctx, `SELECT `+buildCacheColumns+` FROM build_cache
		WHERE team_id = ? AND cache_key = ?`, teamID, key))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("build cache %s: %w", key, err)
	}
	return e, nil
}

// ListBuildCache implements [store.Templates].
func (s *Store) ListBuildCache(ctx context.Context, teamID string) ([]store.BuildCacheEntry, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+buildCacheColumns+` FROM build_cache
		WHERE team_id = ? ORDER BY created_us, cache_key`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list build cache of %s: %w", teamID, err)
	}
	defer rows.Close()
	var es []store.BuildCacheEntry
	for rows.Next() {
		e, err := scanBuildCache(rows)
		if err != nil {
			return nil, fmt.Errorf("list build cache of %s: %w", teamID, err)
		}
		es = append(es, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list build cache of %s: %w", teamID, err)
	}
	return es, nil
}

// DeleteBuildCache implements [store.Templates].
func (s *Store) DeleteBuildCache(ctx context.Context, teamID, key string) error {
	if !store.ValidCacheKey(key) {
		return fmt.Errorf("delete build cache: key %q: %w", key, store.ErrInvalid)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM build_cache WHERE team_id = ? AND cache_key = ?`, teamID, key))
	})
	if err != nil {
		return fmt.Errorf("delete build cache %s: %w", key, err)
	}
	return nil
}

// SnapshotInUse implements [store.Templates].
func (s *Store) SnapshotInUse(ctx context.Context, teamID, snapshotID string) (bool, error) {
	if !store.ValidSnapshotID(snapshotID) {
		return false, fmt.Errorf("snapshot in use: snapshot id %q: %w", snapshotID, store.ErrInvalid)
	}
	var used bool
	err := s.r.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM templates WHERE team_id = ?1 AND snapshot_id = ?2) OR
		EXISTS (SELECT 1 FROM build_cache WHERE team_id = ?1 AND snapshot_id = ?2)`, teamID, snapshotID).Scan(&used)
	if err != nil {
		return false, fmt.Errorf("snapshot %s in use: %w", snapshotID, err)
	}
	return used, nil
}
