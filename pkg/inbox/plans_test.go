package inbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// TestStatementsStayCheapAsTheInboxGrows: an inbox that started on an empty
// table, as a new deployment does, reads a row or two of it per copy of a
// message once it holds a history, with no ANALYZE since. Before, a
// duplicate's look-up of its row and the count of its copy (by primary key)
// kept the generic plan Postgres made after their fifth run while the table
// held a few rows, a full scan, and read every row of the inbox for each
// duplicate: in a redelivery storm after a crash, on a table of millions.
func TestStatementsStayCheapAsTheInboxGrows(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE inbox_messages SET (autovacuum_enabled = off)`) // no ANALYZE replans behind the test
	require.NoError(t, err)
	// Two sessions (a delivery reads the table's kind beside its transaction),
	// each keeping the generic plan of a statement from its first run rather
	// than its sixth: the plans Postgres keeps, whichever session runs it.
	pool, plans := pgtest.Explained(t, b.pool, func(c *pgxpool.Config) {
		c.MaxConns = 2
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	mw := b.newInbox(t, inbox.Config{Pool: pool}).Middleware(b.handler.handle)
	copies := func() { // a message, a duplicate of it, a copy with another payload
		id := newID()
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"n":1}`)))
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"n":1}`)))
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"n":2}`)))
	}
	// A table of a few rows, with the statistics autovacuum's first ANALYZE
	// leaves (it runs at 50 rows); the plans are made for it.
	for range 2 {
		copies()
	}
	_, err = b.pool.Exec(b.ctx, `ANALYZE`)
	require.NoError(t, err)
	for range 8 {
		copies()
	}
	_, err = b.pool.Exec(b.ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256)
		SELECT $1, gen_random_uuid()::text, '\x00' FROM generate_series(1, 20000)`, consumer)
	require.NoError(t, err)
	plans.Take()
	for range 3 {
		copies()
	}
	ran := plans.Take()
	explained := map[string]int{}
	for _, p := range ran {
		for _, what := range []string{"INSERT INTO inbox_messages", "SELECT payload_sha256, status FROM inbox_messages", "UPDATE inbox_messages SET duplicates"} {
			if strings.Contains(p.Query, what) {
				explained[what]++
			}
		}
	}
	require.Empty(t, pgtest.Costly(ran, 20, "inbox_messages"), "statements that read more than 20 rows of the inbox (20,000 of history) for one copy")
	require.Equal(t, map[string]int{
		"INSERT INTO inbox_messages": 9, "SELECT payload_sha256, status FROM inbox_messages": 6, "UPDATE inbox_messages SET duplicates": 6,
	}, explained, "the three messages' statements were not all explained")
}

// TestContinuityStaysCheapAsKeysGrow: the continuity check (continuity.go)
// reads and locks its key's row by primary key, however many keys the
// consumer remembers, with the generic plan made while it remembered a few
// and no ANALYZE since. Its first form (a semi-join of the batch's keys)
// read every key of the consumer for each message.
func TestContinuityStaysCheapAsKeysGrow(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE inbox_key_sequences SET (autovacuum_enabled = off)`)
	require.NoError(t, err)
	pool, plans := pgtest.Explained(t, b.pool, func(c *pgxpool.Config) {
		c.MaxConns = 2
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	})
	mw := b.newInbox(t, inbox.Config{Pool: pool}).Middleware(b.handler.handle)
	stream := newID()
	numbered := func(key string, n int) {
		msg := message.NewMessage(newID(), []byte(`{"n":1}`))
		msg.Metadata.Set(outbox.KeyMetadata, key)
		msg.Metadata.Set(outbox.SequenceMetadata, fmt.Sprintf("%s:%d", stream, n))
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
	}
	for i := range 4 {
		numbered(fmt.Sprint("key-", i), 1)
	}
	_, err = b.pool.Exec(b.ctx, `INSERT INTO inbox_key_sequences (consumer, topic, partition_key, stream, seq, message_id)
		SELECT $1, '', 'other-' || g, $2::uuid, 1, 'm' FROM generate_series(1, 20000) g`, consumer, stream)
	require.NoError(t, err)
	plans.Take()
	for i := range 3 {
		numbered(fmt.Sprint("key-", i), 2)
	}
	ran := plans.Take()
	checked := 0
	for _, p := range ran {
		if strings.Contains(p.Query, "inbox_key_sequences") {
			checked++
		}
	}
	require.Equal(t, 3, checked, "the three messages' continuity checks were not all explained")
	require.Empty(t, pgtest.Costly(ran, 20, "inbox_key_sequences"), "statements that read more than 20 of 20,000 keys for one message")
	counts, err := inbox.ReadContinuity(b.ctx, b.pool, consumer)
	require.NoError(t, err)
	require.Zero(t, counts.Gaps+counts.Rewinds)
}
