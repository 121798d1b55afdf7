package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	start := time.Now()
	pg, err := Start(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	t.Logf("postgres started in %v (external=%v, dir=%s)", time.Since(start), pg.External(), pg.Dir())

	url, err := pg.CreateDatabase(ctx, "pgtest_test")
	require.NoError(t, err)
	url2, err := pg.CreateDatabase(ctx, "pgtest_test") // idempotent
	require.NoError(t, err)
	require.Equal(t, url, url2)
	require.Equal(t, pg.URL("pgtest_test"), url)

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var one int
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
	var maxConns, fsync, syncCommit string
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_setting('max_connections'), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&maxConns, &fsync, &syncCommit))
	if !pg.External() {
		require.Equal(t, "300", maxConns)
	}
	require.Equal(t, "on", fsync)
	require.Equal(t, "on", syncCommit)

	// A committed row must survive the crash-restart.
	_, err = conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS durable (id int PRIMARY KEY); INSERT INTO durable VALUES (1) ON CONFLICT DO NOTHING")
	require.NoError(t, err)

	// A test's database is gone when the test ends, even with a pool open
	// on it until then.
	var testDB string
	t.Run("TestDatabase", func(t *testing.T) {
		pool := pg.TestDatabase(t)
		require.NoError(t, pool.QueryRow(ctx, "SELECT current_database()").Scan(&testDB))
	})
	var left bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", testDB).Scan(&left))

	// An Explained pool reports what each statement read: a look-up by key
	// one row, a filter with no index every row it passed over.
	t.Run("Explained", func(t *testing.T) {
		pool, plans := Explained(t, pg.TestDatabase(t))
		_, err := pool.Exec(ctx, `CREATE TABLE t (id int PRIMARY KEY, x int); INSERT INTO t SELECT g, g % 10 FROM generate_series(1, 1000) g; ANALYZE t`)
		require.NoError(t, err)
		plans.Take()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM t WHERE id = $1`, 7).Scan(&n))
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM t WHERE x = $1`, 3).Scan(&n))
		require.Equal(t, 100, n)
		got := plans.Take()
		require.Len(t, got, 2)
		require.Equal(t, 1, got[0].RowsRead("t"), got[0].Query)
		require.Equal(t, 1000, got[1].RowsRead("t"), got[1].Query)
		require.Zero(t, got[1].RowsRead("other"))
		// Costly names each statement that read more than the limit once,
		// with the most rows a run of it read: the scan stops at the 20th
		// and the 50th row of x = 3 (the 193rd and the 493rd of the table).
		for _, limit := range []int{20, 50, 20} {
			_, err := pool.Exec(ctx, `SELECT x FROM t WHERE x = $1 LIMIT $2`, 3, limit)
			require.NoError(t, err)
		}
		require.Equal(t, []string{
			"1000 rows of t: SELECT count(*) FROM t WHERE x = $1",
			"493 rows of t: SELECT x FROM t WHERE x = $1 LIMIT $2",
		}, Costly(append(got, plans.Take()...), 10, "t"))
		require.Empty(t, Costly(got, 1000, "t"))
	})
	require.Truef(t, testDB != "" && !left, "database %q outlived its test", testDB)

	if pg.External() {
		require.Error(t, pg.Restart(ctx), "Restart of external Postgres must fail")
		_ = conn.Close(ctx)
		return
	}

	start = time.Now()
	require.NoError(t, pg.Restart(ctx))
	t.Logf("postgres restarted (-m immediate) in %v", time.Since(start))

	// The old connection was killed by the restart.
	require.Error(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one), "old connection survived the restart")
	_ = conn.Close(ctx)

	conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, "SELECT 1").Scan(&one))
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM durable").Scan(&n))
	require.Equal(t, 1, n)
}
