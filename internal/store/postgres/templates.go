package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

const templateColumns = `team_id, name, version, state, cache_key, snapshot_id, meta, created, updated, rev`

func scanTemplate(row pgx.Row) (store.Template, error) {
	var (
		t    store.Template
		meta []byte
	)
	if err := row.Scan(&t.TeamID, &t.Name, &t.Version, &t.State, &t.Key, &t.SnapshotID, &meta,
		&t.Created, &t.Updated, &t.Rev); err != nil {
		return store.Template{}, err
	}
	t.Meta = meta
	t.Created, t.Updated = t.Created.UTC(), t.Updated.UTC()
	return t, nil
}

func (s *Store) queryTemplates(ctx context.Context, query string, args ...any) ([]store.Template, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+templateColumns+` FROM templates `+query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Template, error) { return scanTemplate(r) })
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
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The counter row outlives the versions, so numbers are never
		// reused. Its row lock serializes concurrent creates of one name
		// until commit.
		err := tx.QueryRow(ctx, `INSERT INTO template_names AS n (team_id, name, last_version) VALUES ($1, $2, 1)
			ON CONFLICT (team_id, name) DO UPDATE SET last_version = n.last_version + 1
			RETURNING last_version`, t.TeamID, t.Name).Scan(&t.Version)
		if err != nil {
			return mapErr(err, "team "+t.TeamID)
		}
		_, err = tx.Exec(ctx, `INSERT INTO templates (`+templateColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			t.TeamID, t.Name, t.Version, string(t.State), t.Key, t.SnapshotID, []byte(t.Meta),
			t.Created, t.Updated, t.Rev)
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
	var row pgx.Row
	if version == 0 {
		row = s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE team_id = $1 AND name = $2 AND state = $3 ORDER BY version DESC LIMIT 1`,
			teamID, name, string(store.TemplateReady))
	} else {
		row = s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates
			WHERE team_id = $1 AND name = $2 AND version = $3`, teamID, name, version)
	}
	t, err := scanTemplate(row)
	if err != nil {
		return store.Template{}, fmt.Errorf("template %s: %w", templateRef(name, version), notFound(err))
	}
	return t, nil
}

// ListTemplates implements [store.Templates].
func (s *Store) ListTemplates(ctx context.Context, teamID, name string) ([]store.Template, error) {
	if name != "" && !store.ValidTemplateName(name) {
		return nil, fmt.Errorf("list templates of %s: name %q: %w", teamID, name, store.ErrInvalid)
	}
	query, args := `WHERE team_id = $1`, []any{teamID}
	if name != "" {
		query, args = query+` AND name = $2`, append(args, name)
	}
	// COLLATE "C": bytewise, whatever the database's collation.
	ts, err := s.queryTemplates(ctx, query+` ORDER BY name COLLATE "C", version`, args...)
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
	err := s.write(ctx, fence, func(q querier) error {
		// One statement, as in UpdateSandbox.
		var err error
		out, err = scanTemplate(q.QueryRow(ctx, `UPDATE templates
			SET state = $1, cache_key = $2, snapshot_id = $3, meta = $4, updated = $5, rev = rev + 1
			WHERE team_id = $6 AND name = $7 AND version = $8 AND rev = $9
			RETURNING `+templateColumns,
			string(t.State), t.Key, t.SnapshotID, []byte(t.Meta), updated,
			t.TeamID, t.Name, t.Version, t.Rev))
		if errors.Is(err, pgx.ErrNoRows) {
			var exists bool
			if err = q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM templates WHERE team_id = $1 AND name = $2 AND version = $3)`,
				t.TeamID, t.Name, t.Version).Scan(&exists); err == nil {
				err = store.ErrNotFound
				if exists {
					err = fmt.Errorf("at rev %d: %w", t.Rev, store.ErrVersionConflict)
				}
			}
		}
		return err
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
	err := deleted(s.pool.Exec(ctx, `DELETE FROM templates WHERE team_id = $1 AND name = $2 AND version = $3`,
		teamID, name, version))
	if err != nil {
		return fmt.Errorf("delete template %s: %w", templateRef(name, version), err)
	}
	return nil
}

// UnsettledTemplates implements [store.TemplateIndex].
func (s *Store) UnsettledTemplates(ctx context.Context) ([]store.Template, error) {
	ts, err := s.queryTemplates(ctx, `WHERE state IN ($1, $2) ORDER BY created, team_id COLLATE "C", name COLLATE "C", version`,
		string(store.TemplateBuilding), string(store.TemplateDeleting))
	if err != nil {
		return nil, fmt.Errorf("unsettled templates: %w", err)
	}
	return ts, nil
}

const buildCacheColumns = `team_id, cache_key, snapshot_id, created`

func scanBuildCache(row pgx.Row) (store.BuildCacheEntry, error) {
	var e store.BuildCacheEntry
	if err := row.Scan(&e.TeamID, &e.Key, &e.SnapshotID, &e.Created); err != nil {
		return store.BuildCacheEntry{}, err
	}
	e.Created = e.Created.UTC()
	return e, nil
}

// PutBuildCache implements [store.Templates].
func (s *Store) PutBuildCache(ctx context.Context, e store.BuildCacheEntry) (store.BuildCacheEntry, error) {
	if err := e.Validate(); err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("put build cache: %w", err)
	}
	e.Created = store.StoredTime(time.Now())
	_, err := s.pool.Exec(ctx, `INSERT INTO build_cache (`+buildCacheColumns+`) VALUES ($1, $2, $3, $4)`,
		e.TeamID, e.Key, e.SnapshotID, e.Created)
	if err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("put build cache %s: %w", e.Key, mapErr(err, "team "+e.TeamID))
	}
	return e, nil
}

// BuildCache implements [store.Templates].
func (s *Store) BuildCache(ctx context.Context, teamID, key string) (store.BuildCacheEntry, error) {
	if !store.ValidCacheKey(key) {
		return store.BuildCacheEntry{}, fmt.Errorf("build cache: key %q: %w", key, store.ErrInvalid)
	}
	e, err := scanBuildCache(s.pool.QueryRow(ctx, `SELECT `+buildCacheColumns+` FROM build_cache
		WHERE team_id = $1 AND cache_key = $2`, teamID, key))
	if err != nil {
		return store.BuildCacheEntry{}, fmt.Errorf("build cache %s: %w", key, notFound(err))
	}
	return e, nil
}

// ListBuildCache implements [store.Templates].
func (s *Store) ListBuildCache(ctx context.Context, teamID string) ([]store.BuildCacheEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+buildCacheColumns+` FROM build_cache
		WHERE team_id = $1 ORDER BY created, cache_key COLLATE "C"`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list build cache of %s: %w", teamID, err)
	}
	es, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.BuildCacheEntry, error) { return scanBuildCache(r) })
	if err != nil {
		return nil, fmt.Errorf("list build cache of %s: %w", teamID, err)
	}
	return es, nil
}

// DeleteBuildCache implements [store.Templates].
func (s *Store) DeleteBuildCache(ctx context.Context, teamID, key string) error {
	if !store.ValidCacheKey(key) {
		return fmt.Errorf("delete build cache: key %q: %w", key, store.ErrInvalid)
	}
	if err := deleted(s.pool.Exec(ctx, `DELETE FROM build_cache WHERE team_id = $1 AND cache_key = $2`, teamID, key)); err != nil {
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
	err := s.pool.QueryRow(ctx, `SELECT
		EXISTS (SELECT 1 FROM templates WHERE team_id = $1 AND snapshot_id = $2) OR
		EXISTS (SELECT 1 FROM build_cache WHERE team_id = $1 AND snapshot_id = $2)`, teamID, snapshotID).Scan(&used)
	if err != nil {
		return false, fmt.Errorf("snapshot %s in use: %w", snapshotID, err)
	}
	return used, nil
}
