package stack

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/standby"
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

// TestPatroniStandbyGate: on the same asynchronous cluster as
// TestPatroniAsyncLoses, a commit counts as acknowledged only once
// pkg/standby's gate released it. While the primary sends no WAL, no wait
// is released; the primary dies with those commits, and every commit the
// gate released is on the new primary. The waits it held end in an error
// (the primary changed, or their time ran out), never as acknowledged.
func TestPatroniStandbyGate(t *testing.T) {
	ctx, c, pool := ackedTable(t, PatroniOptions{})
	gate, err := standby.New(standby.Config{Pool: pool, Standbys: 1, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	require.NoError(t, err)
	var mu sync.Mutex
	var acked []int
	write := func(n int) error {
		var ticket standby.Ticket
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
			if _, err = tx.Exec(ctx, `INSERT INTO acked VALUES ($1)`, n); err != nil {
				return err
			}
			ticket, err = gate.Mark(ctx, tx)
			return err
		})
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		if err := gate.Wait(wctx, ticket); err != nil {
			return err
		}
		mu.Lock()
		acked = append(acked, n)
		mu.Unlock()
		return nil
	}
	for n := 1; n <= 50; n++ {
		require.NoError(t, write(n))
	}
	require.NoError(t, c.WaitStreaming(ctx))
	old := c.Primary()
	stopped, err := old.StopSending()
	require.NoError(t, err)
	require.Equal(t, 2, stopped, "a WAL sender per replica")

	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for n := 51; n <= 100; n++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- write(n) }()
	}
	require.NoError(t, c.waitFor(ctx, time.Minute, "every commit to wait for the standbys", func() bool {
		return gate.Stats().Waiting == 50
	}))
	for reads := gate.Stats().Reads; gate.Stats().Reads < reads+50; {
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	require.Len(t, acked, 50, "no commit is released while no standby receives WAL")
	mu.Unlock()

	old.Kill()
	_, err = c.WaitPrimary(ctx, 2*time.Minute)
	require.NoError(t, err)
	// The new primary goes on writing, past the old one's positions: a
	// wait compared with the new primary's standbys would be released.
	require.NoError(t, c.waitFor(ctx, time.Minute, "the new primary to take writes", func() bool {
		_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS later AS SELECT generate_series(1, 50000) AS n`)
		return err == nil
	}))
	wg.Wait()
	close(errs)
	for err := range errs {
		require.Error(t, err, "a commit the old primary took with it was released")
	}
	var kept []int
	require.NoError(t, c.waitFor(ctx, time.Minute, "the new primary to answer", func() bool {
		rows, err := pool.Query(ctx, `SELECT n FROM acked ORDER BY n`)
		if err != nil {
			return false
		}
		kept, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err == nil
	}))
	t.Logf("the gate released %d commits; the new primary has %d of the 100 made; %d waits failed with ErrPrimaryChanged",
		len(acked), len(kept), gate.Stats().PrimaryChanged)
	require.Subset(t, kept, acked, "every commit the gate released survives the failover")
	require.Less(t, len(kept), 100, "the failover lost the commits made while no standby received them (else the gate had nothing to hold back)")
}

// testWriter logs through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
