// Package migrate applies numbered, embedded SQL files to a Postgres database:
// outbox.Migrate and inbox.Migrate apply the library's tables with it, and a
// program may apply its own the same way (the reference services do).
//
// Each component (the outbox, the inbox, a service) owns a set of files named
// NNN_description.sql. Applied versions are recorded per component in
// schema_migrations, and the whole run holds an advisory lock, so replicas
// starting at the same moment apply each file exactly once.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lockKey is an arbitrary constant shared by every component's migrations.
const lockKey = 7_412_001

// Apply runs the *.sql files of fsys that component has not applied yet, in
// order of their numeric prefix, each in its own transaction.
func Apply(ctx context.Context, pool *pgxpool.Pool, component string, fsys fs.FS) error {
	files, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return fmt.Errorf("listing migrations: %w", err)
	}
	type file struct {
		version int
		name    string
	}
	var todo []file
	for _, name := range files {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			return fmt.Errorf("migration %q: name must start with a number and an underscore", name)
		}
		todo = append(todo, file{v, name})
	}
	sort.Slice(todo, func(i, j int) bool { return todo[i].version < todo[j].version })

	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquiring connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		return fmt.Errorf("taking migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey) //nolint:errcheck // released with the session anyway

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		component  text        NOT NULL,
		version    int         NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, version))`); err != nil {
		return fmt.Errorf("creating schema_migrations: %w", err)
	}

	for _, f := range todo {
		sql, err := fs.ReadFile(fsys, f.name)
		if err != nil {
			return fmt.Errorf("reading %s: %w", f.name, err)
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `INSERT INTO schema_migrations (component, version, name)
				VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, component, f.version, f.name)
			if err != nil || tag.RowsAffected() == 0 {
				return err // already applied, or failed
			}
			_, err = tx.Exec(ctx, string(sql))
			return err
		})
		if err != nil {
			return fmt.Errorf("applying %s %s: %w", component, f.name, err)
		}
	}
	return nil
}
