package pgtest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestMain is a package's TestMain for tests that need only Postgres: it
// starts the throwaway server (or uses DATABASE_URL) into *pg, runs the
// tests, stops the server and exits.
//
//	var pg *pgtest.Server
//	func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }
func TestMain(m *testing.M, pg **Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	var err error
	*pg, err = Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tests:", err)
		os.Exit(1)
	}
	code := m.Run()
	(*pg).Stop() //nolint:errcheck // best effort; the next run reaps the temp dir
	os.Exit(code)
}

// TestDatabase creates an empty database of its own for t and returns a pool
// on it, closed when the test ends.
func (p *Server) TestDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	name := strings.ToLower(fmt.Sprintf("test_%d_%s", os.Getpid(), uuid.NewString()[:8]))
	url, err := p.CreateDatabase(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	p.DropWhenDone(t, name)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// DropWhenDone drops database name when t ends. Cleanups run last-registered
// first, so call it before opening pools on the database: they close first.
func (p *Server) DropWhenDone(t testing.TB, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.DropDatabase(ctx, name); err != nil {
			t.Logf("leaving database %s behind: %v", name, err)
		}
	})
}
