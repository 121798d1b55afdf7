package stack

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TestPatroniFailover: a synchronous cluster keeps every acknowledged
// commit across a switchover and a SIGKILL of its primary, and the same
// pool, through the multi-host URL, reaches each new primary by itself;
// the killed node comes back as a replica of the new one.
func TestPatroniFailover(t *testing.T) {
	ctx, c, pool := ackedTable(t, PatroniOptions{Synchronous: true})

	acked := 0
	write := func(n int) {
		t.Helper()
		// A write fails while no primary answers; it is tried again until
		// one does. Only a write that returned is counted as acknowledged.
		require.NoError(t, c.waitFor(ctx, 2*time.Minute, "a write to commit", func() bool {
			_, err := pool.Exec(ctx, `INSERT INTO acked VALUES ($1) ON CONFLICT DO NOTHING`, n)
			return err == nil
		}))
		acked++
	}
	for n := 1; n <= 50; n++ {
		write(n)
	}

	first := c.Primary()
	second, err := c.Switchover(ctx)
	require.NoError(t, err)
	require.NotEqual(t, first.Name, second.Name)
	for n := 51; n <= 100; n++ {
		write(n)
	}

	// In synchronous mode only the standby the primary named may be
	// promoted: a primary killed before it named one leaves none to
	// promote until it returns (WaitHealthy's doc). Kill it once it has.
	require.NoError(t, c.WaitHealthy(ctx))
	second.Kill()
	third, err := c.WaitPrimary(ctx, 2*time.Minute)
	require.NoError(t, err)
	require.NotEqual(t, second.Name, third.Name)
	for n := 101; n <= 150; n++ {
		write(n)
	}
	var count int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&count))
	require.Equal(t, acked, count, "every acknowledged commit survives the switchover and the kill")

	require.NoError(t, second.Start())
	require.NoError(t, c.WaitHealthy(ctx), "the killed node rejoins as a replica")
	require.False(t, second.Primary())
}

// TestPatroniAsyncLoses is the control: on asynchronous replication, a
// primary that stopped sending WAL commits on, and the replica promoted
// when it dies has none of those commits: acknowledged writes are lost.
// Without it, TestPatroniFailover's count would prove nothing.
func TestPatroniAsyncLoses(t *testing.T) {
	ctx, c, pool := ackedTable(t, PatroniOptions{})
	for n := 1; n <= 50; n++ {
		_, err := pool.Exec(ctx, `INSERT INTO acked VALUES ($1)`, n)
		require.NoError(t, err)
	}
	require.NoError(t, c.WaitStreaming(ctx))
	old := c.Primary()
	stopped, err := old.StopSending()
	require.NoError(t, err)
	require.Equal(t, 2, stopped, "a WAL sender per replica")
	for n := 51; n <= 100; n++ {
		_, err := pool.Exec(ctx, `INSERT INTO acked VALUES ($1)`, n) // acknowledged: asynchronous
		require.NoError(t, err)
	}
	old.Kill()
	_, err = c.WaitPrimary(ctx, 2*time.Minute)
	require.NoError(t, err)
	var count int
	require.NoError(t, c.waitFor(ctx, time.Minute, "the new primary to answer", func() bool {
		return pool.QueryRow(ctx, `SELECT count(*) FROM acked`).Scan(&count) == nil
	}))
	t.Logf("acknowledged 100 commits; the new primary has %d", count)
	require.Less(t, count, 100, "the commits made while no replica received them are lost")
	require.GreaterOrEqual(t, count, 50, "what the replicas had before is kept")
}

// ackedTable starts a cluster (skipping t where none can start here) and a
// table of acknowledged writes on it, through the multi-host URL; all go
// when t ends.
func ackedTable(t *testing.T, opts PatroniOptions) (context.Context, *PatroniCluster, *pgxpool.Pool) {
	t.Helper()
	RequirePatroni(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	opts.Log = t.Logf
	c, err := StartPatroni(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	url, err := c.CreateDatabase(ctx, "acked")
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE acked (n int PRIMARY KEY)`)
	require.NoError(t, err)
	return ctx, c, pool
}
