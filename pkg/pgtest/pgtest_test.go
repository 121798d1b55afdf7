package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func equal[T comparable](t testing.TB, want, got T) {
	t.Helper()
	if want != got {
		t.Fatalf("want %v, got %v", want, got)
	}
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

func TestPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	start := time.Now()
	pg, err := Start(ctx)
	must(t, err)
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	t.Logf("postgres started in %v (external=%v, dir=%s)", time.Since(start), pg.External(), pg.Dir())

	url, err := pg.CreateDatabase(ctx, "pgtest_test")
	must(t, err)
	url2, err := pg.CreateDatabase(ctx, "pgtest_test") // idempotent
	must(t, err)
	equal(t, url, url2)
	equal(t, pg.URL("pgtest_test"), url)

	conn, err := pgx.Connect(ctx, url)
	must(t, err)
	var one int
	must(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	equal(t, 1, one)
	var maxConns, fsync, syncCommit string
	must(t, conn.QueryRow(ctx, "SELECT current_setting('max_connections'), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&maxConns, &fsync, &syncCommit))
	if !pg.External() {
		equal(t, "300", maxConns)
	}
	equal(t, "on", fsync)
	equal(t, "on", syncCommit)

	// A committed row must survive the crash-restart.
	_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS durable (id int PRIMARY KEY); INSERT INTO durable VALUES (1) ON CONFLICT DO NOTHING")
	must(t, err)

	// A test's database is gone when the test ends, even with a pool open
	// on it until then.
	var testDB string
	t.Run("TestDatabase", func(t *testing.T) {
		pool := pg.TestDatabase(t)
		must(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&testDB))
	})
	var left bool
	must(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", testDB).Scan(&left))
	check(t, testDB != "" && !left, "database %q outlived its test", testDB)

	if pg.External() {
		check(t, pg.Restart(ctx) != nil, "Restart of external Postgres must fail")
		_ = conn.Close(ctx)
		return
	}

	start = time.Now()
	must(t, pg.Restart(ctx))
	t.Logf("postgres restarted (-m immediate) in %v", time.Since(start))

	// The old connection was killed by the restart.
	check(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one) != nil, "old connection survived the restart")
	_ = conn.Close(ctx)

	conn, err = pgx.Connect(ctx, url)
	must(t, err)
	defer conn.Close(ctx)
	must(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	var n int
	must(t, conn.QueryRow(ctx, "SELECT count(*) FROM durable").Scan(&n))
	equal(t, 1, n)
}
