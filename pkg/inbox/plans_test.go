package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
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
	counts, err := inboxadmin.New(b.pool).Continuity(b.ctx, consumer)
	require.NoError(t, err)
	require.Zero(t, counts.Gaps+counts.Rewinds)
}

// TestGroupPagesStayCheap: a failure group's messages are read a page at a
// time by keyset (QuarantineFilter.Group and After), from the groups index,
// however many rows of other groups the quarantine holds: a page reads its
// rows and no more, the last page as the first; and a bulk action's batch
// reads its items and its messages the same way.
func TestGroupPagesStayCheap(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	_, err := b.pool.Exec(b.ctx, `ALTER TABLE inbox_quarantine SET (autovacuum_enabled = off)`)
	require.NoError(t, err)
	pool, plans := pgtest.Explained(t, b.pool, func(c *pgxpool.Config) { c.MaxConns = 1 })
	deadLetters(t, b.ctx, b, 40000, func(i int) string { // two groups, interleaved: 200 and 39,800
		if i%200 == 0 {
			return badDeploy(i)
		}
		return fmt.Sprintf("timeout after %dms", i)
	}, nil)
	_, err = b.pool.Exec(b.ctx, `ANALYZE inbox_quarantine`)
	require.NoError(t, err)
	groups, err := inboxadmin.New(pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, groups, 2)
	require.EqualValues(t, 200, groups[1].Count)

	plans.Take()
	var after int64
	for page := 0; page < 4; page++ {
		list, err := inboxadmin.New(pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer, Group: groups[1].ID, After: after, Limit: 50})
		require.NoError(t, err)
		require.Len(t, list, 50)
		after = list[len(list)-1].ID
	}
	ran := plans.Take()
	require.Len(t, ran, 4)
	require.Empty(t, pgtest.Costly(ran, 60, "inbox_quarantine"), "pages that read more than their 50 rows (and a few) of 40,000")

	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Group: groups[0].ID})
	require.NoError(t, err)
	require.EqualValues(t, 39800, plan.Count)
	a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionDrop, plan, "alice", "timeouts of the old network")
	require.NoError(t, err)
	_, err = pool.Exec(b.ctx, `ANALYZE inbox_action_items`)
	require.NoError(t, err)
	plans.Take()
	ctx, stop := context.WithCancel(b.ctx) // stopped after ten batches
	defer stop()
	_, err = inboxadmin.New(pool).RunBulk(ctx, a.ID, inboxadmin.BulkOptions{BatchSize: 100, Progress: func(a inboxadmin.Action) {
		if a.Done >= 1000 {
			stop()
		}
	}})

	require.ErrorIs(t, err, context.Canceled)
	ran = plans.Take()
	var batches int
	for _, p := range ran {
		if strings.Contains(p.Query, "FROM inbox_action_items") {
			batches++
		}
	}
	require.Equal(t, 10, batches)
	require.Empty(t, pgtest.Costly(ran, 120, "inbox_action_items", "inbox_quarantine"),
		"statements of a batch of 100 that read more than 120 rows of 39,800 items or 40,000 messages")
}
