package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestSchemasAreSeparateOutboxes: two outboxes in two schemas of one
// database (pools with search_path=a and search_path=b) have their own
// tables, their own relay lead and their own notifications. Relay a is held
// inside its batch, its lead lock taken; relay b must still publish b's
// rows, and be woken by b's commit, not wait for a or for its poll. With
// one lead lock for the whole database (the lock keys before they were
// derived from the schema), b claims nothing while a holds the lead.
func TestSchemasAreSeparateOutboxes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	t.Cleanup(cancel)
	name := uniqueName(t)
	url, err := testPG.CreateDatabase(ctx, name)
	require.NoError(t, err)
	testPG.DropWhenDone(t, name)
	inSchema := func(schema string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
		require.NoError(t, err)
		require.NoError(t, outbox.Migrate(ctx, pool))
		return pool
	}
	poolA, poolB := inSchema("a"), inSchema("b")
	topicA, topicB := newTopic(t), newTopic(t)
	sink := newSink(t, topicA, topicB)

	// Relay a: its first batch blocks in Publish, inside the transaction
	// that holds a's lead.
	gated := newGatedPublisher(newPublisher(t))
	relayA := newRelay(t, outbox.RelayConfig{Pool: poolA, Publisher: gated})
	startRelay(t, relayA)
	t.Cleanup(gated.Release) // runs before the relay is stopped
	a := []*message.Message{outbox.NewMessage("k", []byte("a1"))}
	publishCommitted(t, poolA, topicA, a...)
	gated.WaitEntered(t)

	// Relay b, with a poll far too slow to matter: only b's own
	// notification can wake it in time.
	relayB := newRelay(t, outbox.RelayConfig{Pool: poolB, Publisher: newPublisher(t), PollInterval: time.Hour})
	startRelay(t, relayB)
	require.Eventually(t, func() bool {
		var listening bool
		require.NoError(t, poolB.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND query = $1)`, "LISTEN "+pgx.Identifier{outbox.NotifyChannel("b")}.Sanitize()).Scan(&listening))
		return listening
	}, waitTimeout, 10*time.Millisecond, "relay b does not listen on b's channel")
	// b0 shows relay b past its start-up claim and its follow-up polls
	// (5 × 5ms); from then on only a notification on b's channel brings
	// b1 and b2 out before the hour-long poll.
	b0 := outbox.NewMessage("k", []byte("b0"))
	publishCommitted(t, poolB, topicB, b0)
	sink.WaitFor(t, []string{b0.UUID})
	time.Sleep(200 * time.Millisecond)
	b := []*message.Message{outbox.NewMessage("k", []byte("b1")), outbox.NewMessage("k", []byte("b2"))}
	publishCommitted(t, poolB, topicB, b...)
	sink.WaitFor(t, ids(b))
	require.Zero(t, sink.Counts()[a[0].UUID], "a's row left while a's relay was held")

	gated.Release()
	sink.WaitFor(t, ids(a))
	count := func(pool *pgxpool.Pool) (n int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages`).Scan(&n))
		return n
	}
	require.Equal(t, 1, count(poolA), "a's table holds a's row only")
	require.Equal(t, 3, count(poolB), "b's table holds b's rows only")
}
