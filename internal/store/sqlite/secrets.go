package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"space/internal/store"
)

// secretColumns are the columns of a secret's record; listings leave out
// sealed.
const (
	secretColumns     = `team_id, name, sealed, hosts, header, format, created_us, updated_us`
	secretListColumns = `team_id, name, NULL, hosts, header, format, created_us, updated_us`
)

func scanSecret(sc interface{ Scan(...any) error }) (store.Secret, error) {
	var (
		s                store.Secret
		sealed           []byte // scanned as []byte: database/sql copies it
		hosts            string
		created, updated int64
	)
	if err := sc.Scan(&s.TeamID, &s.Name, &sealed, &hosts, &s.Header, &s.Format, &created, &updated); err != nil {
		return store.Secret{}, err
	}
	if err := json.Unmarshal([]byte(hosts), &s.Hosts); err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: hosts: %w", s.Name, err)
	}
	s.Sealed = sealed
	s.Created, s.Updated = fromMicros(created), fromMicros(updated)
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
	hosts, err := json.Marshal(sc.Hosts)
	if err != nil {
		return store.Secret{}, fmt.Errorf("create secret %s: %w", sc.Name, err)
	}
	err = s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO secrets (`+secretColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			sc.TeamID, sc.Name, sc.Sealed, string(hosts), sc.Header, sc.Format, micros(sc.Created), micros(sc.Updated))
		return mapErr(err, "team "+sc.TeamID)
	})
	if err != nil {
		return store.Secret{}, fmt.Errorf("create secret %s: %w", sc.Name, err)
	}
	return sc, nil
}

// Secret implements [store.Secrets].
func (s *Store) Secret(ctx context.Context, teamID, name string) (store.Secret, error) {
	if !store.ValidSecretName(name) {
		return store.Secret{}, fmt.Errorf("secret name %.100q: %w", name, store.ErrInvalid)
	}
	sc, err := scanSecret(s.r.QueryRowContext(ctx, `SELECT `+secretColumns+` FROM secrets
		WHERE team_id = ? AND name = ?`, teamID, name))
	if errors.Is(err, sql.ErrNoRows) {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: %w", name, err)
	}
	return sc, nil
}

// ListSecrets implements [store.Secrets].
func (s *Store) ListSecrets(ctx context.Context, teamID string) ([]store.Secret, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+secretListColumns+` FROM secrets
		WHERE team_id = ? ORDER BY name`, teamID)
	if err != nil {
		return nil, fmt.Errorf("list secrets of %s: %w", teamID, err)
	}
	defer rows.Close()
	var out []store.Secret
	for rows.Next() {
		sc, err := scanSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list secrets of %s: %w", teamID, err)
		}
		out = append(out, sc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list secrets of %s: %w", teamID, err)
	}
	return out, nil
}

// DeleteSecret implements [store.Secrets].
func (s *Store) DeleteSecret(ctx context.Context, teamID, name string) error {
	if !store.ValidSecretName(name) {
		return fmt.Errorf("delete secret: name %.100q: %w", name, store.ErrInvalid)
	}
	err := s.write(ctx, func(tx *sql.Tx) error {
		return deleted(tx.ExecContext(ctx, `DELETE FROM secrets WHERE team_id = ? AND name = ?`, teamID, name))
	})
	if err != nil {
		return fmt.Errorf("delete secret %s: %w", name, err)
	}
	return nil
}
