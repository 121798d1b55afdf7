package platform

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// TestWriteAnswersOnceTheStandbyHolds: with DATABASE_STANDBYS, Write
// returns only once a streaming standby holds its transaction, and a wait
// that ends without it is a 503 (DatabaseUnavailable), not a 500.
func TestWriteAnswersOnceTheStandbyHolds(t *testing.T) {
	pool := pg.TestDatabase(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE t (id int)`)
	require.NoError(t, err)
	node := pg.StartStandby(t, pool)
	db, err := newDB(Config{DatabaseStandbys: 1, DatabaseStandbySlots: []string{node.Slot}}, pool, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.NotNil(t, db.Standby)

	write := func(ctx context.Context) error {
		return db.Write(ctx, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES (1)`)
			return err
		})
	}
	done := make(chan error, 1)
	go func() { done <- write(t.Context()) }()
	for db.Standby.Stats().Waiting == 0 {
		select {
		case err := <-done:
			t.Fatalf("Write returned (%v) without waiting for the standby", err)
		default:
		}
	}
	for reads := db.Standby.Stats().Reads; db.Standby.Stats().Reads < reads+20; {
		select {
		case err := <-done:
			t.Fatalf("Write returned (%v) before the standby held its transaction", err)
		default:
		}
	}
	node.CatchUp()
	require.NoError(t, <-done)

	// Not confirmed in time: committed, but the client hears 503.
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- write(ctx) }()
	for db.Standby.Stats().Waiting == 0 {
	}
	cancel()
	err = <-done
	require.Error(t, err)
	require.True(t, DatabaseUnavailable(err), "%v", err)
	require.True(t, DatabaseUnavailable(standbyError{standby.ErrPrimaryChanged}))
	require.False(t, DatabaseUnavailable(context.Canceled), "a cancellation alone is not an outage")
	require.Equal(t, 2, scalarInt(t, db, `SELECT count(*) FROM t`))
}

// TestNoStandbysNoWait: DATABASE_STANDBYS 0 makes no gate; Write commits
// and returns. Streaming standbys without synchronous_standby_names are
// warned of at start.
func TestNoStandbysNoWait(t *testing.T) {
	pool := pg.TestDatabase(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE t (id int)`)
	require.NoError(t, err)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	db, err := newDB(Config{}, pool, log)
	require.NoError(t, err)
	require.Nil(t, db.Standby)
	var streaming int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_replication_slots WHERE active`).Scan(&streaming))
	if streaming == 0 { // DATABASE_URL's server may be shared with other tests' standbys
		require.NotContains(t, buf.String(), "replicates asynchronously", "no standby streams yet")
	}
	require.NoError(t, db.Write(t.Context(), func(tx pgx.Tx) error {
		_, err := tx.Exec(t.Context(), `INSERT INTO t VALUES (1)`)
		return err
	}))

	pg.StartStandby(t, pool)
	_, err = newDB(Config{}, pool, log)
	require.NoError(t, err)
	require.Contains(t, buf.String(), "replicates asynchronously and DATABASE_STANDBYS is 0")
	require.False(t, errors.Is(err, standby.ErrPrimaryChanged))
}

func scalarInt(t *testing.T, db DB, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(t.Context(), sql).Scan(&n))
	return n
}
