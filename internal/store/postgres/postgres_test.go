package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"space/internal/store"
	"space/internal/store/postgres"
	"space/internal/store/storetest"
	"space/internal/testenv/pgtest"
)

func TestConformance(t *testing.T) {
	pgtest.Start(t) // holds one server for all subtests
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) string { return pgtest.Start(t) },
		Open: func(ctx context.Context, dsn string) (store.Store, error) {
			return postgres.Open(ctx, dsn)
		},
		Exec: func(ctx context.Context, dsn, query string) error {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, query)
			return err
		},
	})
}

func TestMigrationsIdempotent(t *testing.T) {
	dsn := pgtest.Start(t)
	for range 3 {
		s, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatalf("Open() = %v", err)
		}
		s.Close()
	}
}
