package inbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestRetireConsumer: a consumer that no longer runs leaves rows no sweep
// retires (each consumer sweeps its own). RetireConsumer refuses one that
// finished with a message within the idle time, then deletes its rows (more
// than one transaction's worth), its attempts, held keys and parked
// messages, and leaves its quarantine and every other consumer's rows.
func TestRetireConsumer(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO inbox_messages (consumer, message_id, payload_sha256, processed_at)
		SELECT 'shipping', 'old-' || g, '\x00', now() - interval '2 days' FROM generate_series(1, 25000) g`)
	exec(`INSERT INTO inbox_messages (consumer, message_id, payload_sha256) SELECT 'shipping', 'new', '\x00'`)
	exec(`INSERT INTO inbox_attempts (consumer, message_id, attempts, last_error) VALUES ('shipping', 'retrying', 2, 'boom')`)
	exec(`INSERT INTO inbox_held_keys (consumer, topic, partition_key, holder) VALUES ('shipping', 't', 'k', 'dead')`)
	exec(`INSERT INTO inbox_parked (consumer, message_id, topic, partition_key, payload, metadata) VALUES ('shipping', 'parked', 't', 'k', '', '{}')`)
	exec(`INSERT INTO inbox_quarantine (consumer, kind, message_id, topic, reason, payload, payload_sha256)
		VALUES ('shipping', 'dead_letter', 'dead', 't', 'boom', '', '\x00')`)
	msg := message.NewMessage("mine", []byte("x"))
	msg.SetContext(b.ctx)
	_, err := in.Middleware(b.handler.handle)(msg)
	require.NoError(t, err)

	list, err := inbox.ListConsumers(b.ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, consumer, list[0].Consumer)
	require.Equal(t, "shipping", list[1].Consumer)
	require.EqualValues(t, 1, list[1].OpenQuarantined)
	require.EqualValues(t, 1, list[1].HeldKeys)
	require.WithinDuration(t, time.Now(), list[1].LastProcessed, time.Minute)

	_, err = inbox.RetireConsumer(b.ctx, b.pool, "shipping", time.Hour)
	require.ErrorIs(t, err, inbox.ErrConsumerActive, "its newest row is from now")
	require.Equal(t, 25001, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = 'shipping'`), "refused: nothing deleted")

	exec(`UPDATE inbox_messages SET processed_at = now() - interval '2 days' WHERE message_id = 'new'`)
	r, err := inbox.RetireConsumer(b.ctx, b.pool, "shipping", time.Hour)
	require.NoError(t, err)
	require.Equal(t, inbox.Retired{Rows: 25001, Attempts: 1, HeldKeys: 1, Parked: 1, OpenQuarantined: 1}, r)
	require.Zero(t, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = 'shipping'`))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = $1`, consumer), "the other consumer's row stays")
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE consumer = 'shipping'`), "its quarantine stays")

	r, err = inbox.RetireConsumer(b.ctx, b.pool, "shipping", time.Hour)
	require.NoError(t, err, "retiring again does nothing")
	require.Equal(t, inbox.Retired{OpenQuarantined: 1}, r)
	list, err = inbox.ListConsumers(b.ctx, b.pool)
	require.NoError(t, err)
	require.Len(t, list, 1)
}

// TestRetiredConsumerReleasesItsPartitions: a partition where a consumer
// that no longer runs has rows is never dropped (it will never clear it);
// once that consumer is retired, the next sweep drops it.
func TestRetiredConsumerReleasesItsPartitions(t *testing.T) {
	day := 24 * time.Hour
	p := inbox.Partitioning{Interval: day, Ahead: 1}
	_, b := setup(t, inbox.Config{})
	now := time.Now().UTC()
	cut := now.Truncate(day).Add(-10 * day)
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, cut))
	_, err := inbox.MakePartitionsAt(b.ctx, b.pool, p, now.Add(-7*day))
	require.NoError(t, err)
	cfg := func(name string) inbox.Config {
		return inbox.Config{Consumer: name, Partitions: &p, Retention: day, RedeliveryHorizon: day,
			LogStart: func(context.Context) (inbox.LogStart, error) { return inbox.LogStart{"": {0: 10}}, nil },
			Position: func(m *message.Message) (int32, int64, bool) {
				off, err := strconv.ParseInt(m.Metadata.Get("offset"), 10, 64)
				return 0, off, err == nil
			}}
	}
	in, gone := b.newInbox(t, cfg(consumer)), b.newInbox(t, cfg("shipping"))
	at := now.Truncate(day).Add(-7*day + time.Hour)
	for i, mw := range []message.HandlerFunc{in.Middleware(b.handler.handle), gone.Middleware(b.handler.handle)} {
		msg := message.NewMessage(idAt(at), []byte("x"))
		msg.Metadata.Set("offset", strconv.Itoa(i+1))
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '3 days'`)
	require.NoError(t, err)
	partition := "inbox_messages_p" + at.Truncate(day).Format("20060102t1504")
	table := func() bool {
		return scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)`, partition)
	}
	require.True(t, table())

	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.True(t, table(), "shipping has rows there and has not cleared it")
	r, err := inbox.RetireConsumer(b.ctx, b.pool, "shipping", time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Rows)
	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.False(t, table(), "shipping retired: the partition goes")
}
