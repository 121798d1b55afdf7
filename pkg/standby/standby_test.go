package standby_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// commit commits one row in a transaction of its own, marked, and returns
// the ticket and the position the commit ended at.
func commit(t *testing.T, pool *pgxpool.Pool, g *standby.Gate) (standby.Ticket, pglogrepl.LSN) {
	t.Helper()
	var ticket standby.Ticket
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `INSERT INTO t VALUES (default)`); err != nil {
			return err
		}
		var err error
		ticket, err = g.Mark(t.Context(), tx)
		return err
	}))
	return ticket, flushedNow(t, pool)
}

func setup(t *testing.T, cfg standby.Config) (*pgxpool.Pool, *standby.Gate) {
	t.Helper()
	pool := pg.TestDatabase(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE t (id bigserial PRIMARY KEY)`)
	require.NoError(t, err)
	cfg.Pool = pool
	cfg.Logger = slog.New(slog.NewTextHandler(tWriter{t}, nil))
	g, err := standby.New(cfg)
	require.NoError(t, err)
	return pool, g
}

func flushedNow(t *testing.T, pool *pgxpool.Pool) pglogrepl.LSN {
	var lsn pglogrepl.LSN
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn))
	return lsn
}

// tWriter logs through t.
type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// waitAsync runs Wait in the background.
func waitAsync(g *standby.Gate, ctx context.Context, ticket standby.Ticket) <-chan error {
	done := make(chan error, 1)
	go func() { done <- g.Wait(ctx, ticket) }()
	return done
}

// stillWaiting checks that the wait has not returned after the gate read
// the positions n more times.
func stillWaiting(t *testing.T, g *standby.Gate, done <-chan error, n int64) {
	t.Helper()
	from := g.Stats().Reads
	for g.Stats().Reads < from+n {
		select {
		case err := <-done:
			t.Fatalf("the wait returned (%v) before the standby held the transaction", err)
		case <-time.After(time.Millisecond):
		}
	}
	require.Equal(t, 1, g.Stats().Waiting)
}

func TestWaitReleasesOnceTheStandbyHolds(t *testing.T) {
	pool, g := setup(t, standby.Config{})
	s := pg.StartStandby(t, pool)

	ticket, end := commit(t, pool, g)
	done := waitAsync(g, t.Context(), ticket)
	stillWaiting(t, g, done, 5)

	s.Flushed(end - 1) // one byte short
	stillWaiting(t, g, done, 5)

	// What the primary flushed by now (the gate's target, and whatever
	// the server wrote since, such as its periodic running-transactions
	// record).
	s.CatchUp()
	require.NoError(t, <-done)
	require.Equal(t, int64(1), g.Stats().Released)
}

func TestStandbysCountsStreamingSlotsOnly(t *testing.T) {
	t.Run("two needed, one streams", func(t *testing.T) {
		pool, g := setup(t, standby.Config{Standbys: 2})
		s := pg.StartStandby(t, pool)
		// A slot whose standby does not stream does not count, whatever it
		// says it holds.
		idle := fmt.Sprintf("idle_%d", time.Now().UnixNano())
		_, err := pool.Exec(t.Context(), `SELECT pg_create_physical_replication_slot($1, true)`, idle)
		require.NoError(t, err)
		t.Cleanup(func() { // a reserved slot keeps WAL on a server the tests may share
			pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, idle) //nolint:errcheck
		})
		neverReleased(t, pool, g, s)
	})
	t.Run("a slot left out", func(t *testing.T) {
		pool, g := setup(t, standby.Config{Slots: []string{"a_slot_of_a_delayed_standby"}})
		neverReleased(t, pool, g, pg.StartStandby(t, pool))
	})
}

// neverReleased commits, lets s catch up, and checks that g still holds
// the wait over 10 of its reads; the wait then ends with its context.
func neverReleased(t *testing.T, pool *pgxpool.Pool, g *standby.Gate, s *pgtest.Standby) {
	t.Helper()
	ticket, _ := commit(t, pool, g)
	ctx, cancel := context.WithCancel(t.Context())
	done := waitAsync(g, ctx, ticket)
	s.CatchUp()
	stillWaiting(t, g, done, 10)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Equal(t, 0, g.Stats().Waiting)
}

func TestNilGateWaitsForNothing(t *testing.T) {
	var g *standby.Gate
	ticket, err := g.Mark(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, g.Wait(t.Context(), ticket))
	require.Equal(t, standby.Stats{}, g.Stats())
}

func TestWaitRefusesATicketNoMarkGave(t *testing.T) {
	_, g := setup(t, standby.Config{})
	err := g.Wait(t.Context(), standby.Ticket{})
	require.Error(t, err)
	require.False(t, errors.Is(err, standby.ErrPrimaryChanged))
}

func TestConfigValidate(t *testing.T) {
	require.ErrorContains(t, standby.Config{}.Validate(), "Pool")
	_, g := setup(t, standby.Config{})
	require.NotNil(t, g)
	_, err := standby.New(standby.Config{Pool: &pgxpool.Pool{}, Standbys: -1})
	require.ErrorContains(t, err, "Standbys")
}
