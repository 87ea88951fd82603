package postgres

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
)

// secretColumns are the columns of a secret's record; listings leave out
// sealed.
const (
	secretColumns     = `team_id, name, sealed, hosts, header, format, created, updated`
	secretListColumns = `team_id, name, NULL::bytea, hosts, header, format, created, updated`
)

func scanSecret(row pgx.Row) (store.Secret, error) {
	var s store.Secret
	if err := row.Scan(&s.TeamID, &s.Name, &s.Sealed, &s.Hosts, &s.Header, &s.Format, &s.Created, &s.Updated); err != nil {
		return store.Secret{}, err
	}
	s.Created, s.Updated = s.Created.UTC(), s.Updated.UTC()
	return s, nil
}

// CreateSecret implements [store.Secrets].
func (s *Store) CreateSecret(ctx context.Context, sc store.Secret) (store.Secret, error) {
	if err := sc.Validate(); err != nil {
		return store.Secret{}, fmt.Errorf("create secret: %w", err)
	}
	sc.Sealed = slices.Clone(sc.Sealed)
	sc.Hosts = slices.Clone(sc.Hosts)
	sc.Created = store.StoredTime(time.Now())
	sc.Updated = sc.Created
	_, err := s.pool.Exec(ctx, `INSERT INTO secrets (`+secretColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		sc.TeamID, sc.Name, sc.Sealed, sc.Hosts, sc.Header, sc.Format, sc.Created, sc.Updated)
	if err != nil {
		return store.Secret{}, fmt.Errorf("create secret %s: %w", sc.Name, mapErr(err, "team "+sc.TeamID))
	}
	return sc, nil
}

// Secret implements [store.Secrets].
func (s *Store) Secret(ctx context.Context, teamID, name string) (store.Secret, error) {
	if !store.ValidSecretName(name) {
		return store.Secret{}, fmt.Errorf("secret name %.100q: %w", name, store.ErrInvalid)
	}
	sc, err := scanSecret(s.pool.QueryRow(ctx, `SELECT `+secretColumns+` FROM secrets
		WHERE team_id = $1 AND name = $2`, teamID, name))
	if err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: %w", name, notFound(err))
	}
	return sc, nil
}

// ListSecrets implements [store.Secrets].
func (s *Store) ListSecrets(ctx context.Context, teamID string) ([]store.Secret, error) {
	// COLLATE "C": bytewise, whatever the database's collation.
	rows, err := s.pool.Query(ctx, `SELECT `+secretListColumns+` FROM secrets
		WHERE team_id = $1 ORDER BY name COLLATE "C"`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list secrets of %s: %w", teamID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Secret, error) { return scanSecret(r) })
	if err != nil {
		return nil, fmt.Errorf("list secrets of %s: %w", teamID, err)
	}
	return out, nil
}

// DeleteSecret implements [store.Secrets].
func (s *Store) DeleteSecret(ctx context.Context, teamID, name string) error {
	if !store.ValidSecretName(name) {
		return fmt.Errorf("delete secret: name %.100q: %w", name, store.ErrInvalid)
	}
	err := deleted(s.pool.Exec(ctx, `DELETE FROM secrets WHERE team_id = $1 AND name = $2`, teamID, name))
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	return nil
}
