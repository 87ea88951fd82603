package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"space/internal/store"
)

const snapshotColumns = `id, team_id, sandbox_id, name, state, worker_id, manifest, logical_bytes, new_bytes, meta, created_us, updated_us, version`

func scanSnapshot(sc interface{ Scan(...any) error }) (store.Snapshot, error) {
	var (
		sn               store.Snapshot
		meta             []byte // scanned as []byte: database/sql copies it
		created, updated int64
	)
	if err := sc.Scan(&sn.ID, &sn.TeamID, &sn.SandboxID, &sn.Name, &sn.State, &sn.WorkerID, &sn.Manifest,
		&sn.LogicalBytes, &sn.NewBytes, &meta, &created, &updated, &sn.Version); err != nil {
		return store.Snapshot{}, err
	}
	sn.Meta = meta
	sn.Created, sn.Updated = fromMicros(created), fromMicros(updated)
	return sn, nil
}

// CreateSnapshot implements [store.Snapshots].
func (s *Store) CreateSnapshot(ctx context.Context, sn store.Snapshot) (store.Snapshot, error) {
	if err := sn.Validate(); err != nil {
		return store.Snapshot{}, fmt.Errorf("create snapshot: %w", err)
	}
	sn.Meta = cloneJSON(sn.Meta)
	sn.Created = store.StoredTime(time.Now())
	sn.Updated = sn.Created
	sn.Version = 1
	err := s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			sn.ID, sn.TeamID, sn.SandboxID, sn.Name, sn.State, sn.WorkerID, sn.Manifest,
			sn.LogicalBytes, sn.NewBytes, nullBytes(sn.Meta), micros(sn.Created), micros(sn.Updated), sn.Version)
		return mapErr(err, "team "+sn.TeamID)
	})
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return sn, nil
}

// Snapshot implements [store.Snapshots].
func (s *Store) Snapshot(ctx context.Context, teamID, id string) (store.Snapshot, error) {
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE team_id = ? AND id = ?`, teamID, id))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return sn, nil
}

// SnapshotByName implements [store.Snapshots].
func (s *Store) SnapshotByName(ctx context.Context, teamID, name string) (store.Snapshot, error) {
	if name == "" {
		return store.Snapshot{}, fmt.Errorf("snapshot by name: empty name: %w", store.ErrInvalid)
	}
	sn, err := scanSnapshot(s.r.QueryRowContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE team_id = ? AND name = ?`, teamID, name))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("snapshot named %s: %w", name, err)
	}
	return sn, nil
}

// ListSnapshots implements [store.Snapshots].
func (s *Store) ListSnapshots(ctx context.Context, teamID, sandboxID string) ([]store.Snapshot, error) {
	if sandboxID != "" && !store.ValidSandboxID(sandboxID) {
		return nil, fmt.Errorf("list snapshots of %s: sandbox id %q: %w", teamID, sandboxID, store.ErrInvalid)
	}
	query, args := `WHERE team_id = ?`, []any{teamID}
	if sandboxID != "" {
		query, args = query+` AND sandbox_id = ?`, append(args, sandboxID)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots `+query+` ORDER BY created_us, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", teamID, err)
	}
	defer rows.Close()
	var sns []store.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots of %s: %w", teamID, err)
		}
		sns = append(sns, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", teamID, err)
	}
	return sns, nil
}

// UpdateSnapshot implements [store.Snapshots].
func (s *Store) UpdateSnapshot(ctx context.Context, sn store.Snapshot) (store.Snapshot, error) {
	return s.updateSnapshot(ctx, nil, sn)
}

// updateSnapshot is UpdateSnapshot, fenced by fence unless it is nil.
func (s *Store) updateSnapshot(ctx context.Context, fence *store.Lease, sn store.Snapshot) (store.Snapshot, error) {
	if err := sn.Validate(); err != nil {
		return store.Snapshot{}, fmt.Errorf("update snapshot: %w", err)
	}
	updated := store.StoredTime(time.Now())
	var out store.Snapshot
	err := s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		var err error
		out, err = scanSnapshot(tx.QueryRowContext(ctx, `UPDATE snapshots
			SET state = ?, worker_id = ?, manifest = ?, logical_bytes = ?, new_bytes = ?, meta = ?, updated_us = ?, version = version + 1
			WHERE team_id = ? AND id = ? AND version = ?
			RETURNING `+snapshotColumns,
			sn.State, sn.WorkerID, sn.Manifest, sn.LogicalBytes, sn.NewBytes, nullBytes(sn.Meta), micros(updated),
			sn.TeamID, sn.ID, sn.Version))
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM snapshots WHERE team_id = ? AND id = ?`, sn.TeamID, sn.ID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return store.ErrNotFound
		}
		return fmt.Errorf("at version %d: %w", sn.Version, store.ErrVersionConflict)
	})
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("update snapshot %s: %w", sn.ID, err)
	}
	return out, nil
}

// DeleteSnapshot implements [store.Snapshots].
func (s *Store) DeleteSnapshot(ctx context.Context, teamID, id string) error {
	return s.deleteSnapshot(ctx, nil, teamID, id)
}

// deleteSnapshot is DeleteSnapshot, fenced by fence unless it is nil.
func (s *Store) deleteSnapshot(ctx context.Context, fence *store.Lease, teamID, id string) error {
	err := s.writeFenced(ctx, fence, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM snapshots WHERE team_id = ? AND id = ?`, teamID, id))
	})
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

// TeamSnapshotBytes implements [store.Snapshots].
func (s *Store) TeamSnapshotBytes(ctx context.Context, teamID string) (int64, error) {
	var n int64
	if err := s.r.QueryRowContext(ctx, `SELECT coalesce(sum(new_bytes), 0) FROM snapshots WHERE team_id = ?`, teamID).Scan(&n); err != nil {
		return 0, fmt.Errorf("snapshot bytes of %s: %w", teamID, err)
	}
	return n, nil
}

// AllSnapshotManifests implements [store.SnapshotIndex].
func (s *Store) AllSnapshotManifests(ctx context.Context) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT manifest FROM snapshots WHERE manifest <> '' ORDER BY manifest`)
	if err != nil {
		return nil, fmt.Errorf("all snapshot manifests: %w", err)
	}
	defer rows.Close()
	var ms []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			return nil, fmt.Errorf("all snapshot manifests: %w", err)
		}
		ms = append(ms, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("all snapshot manifests: %w", err)
	}
	return ms, nil
}

// UnsettledSnapshots implements [store.SnapshotIndex].
func (s *Store) UnsettledSnapshots(ctx context.Context) ([]store.Snapshot, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+snapshotColumns+` FROM snapshots WHERE state IN (?, ?) ORDER BY created_us, id`,
		store.SnapshotCreating, store.SnapshotDeleting)
	if err != nil {
		return nil, fmt.Errorf("unsettled snapshots: %w", err)
	}
	defer rows.Close()
	var sns []store.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("unsettled snapshots: %w", err)
		}
		sns = append(sns, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("unsettled snapshots: %w", err)
	}
	return sns, nil
}
