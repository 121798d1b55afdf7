package inbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
)

// TestRetireConsumer: a consumer that no longer runs leaves rows no sweep
// retires (each consumer sweeps its own). inboxadmin.Admin.Retire refuses a name with
// nothing to retire, and one that wrote to the inbox within the idle time (a
// row, a failed attempt, a hold, a parked message), and one with parked
// messages unless told to drop them; then it deletes its rows, more than one
// transaction's worth, its attempts, holds and parked messages, and leaves
// its quarantine and every other consumer's rows.
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
	exec(`INSERT INTO inbox_parked (consumer, message_id, topic, partition_key, payload) VALUES ('shipping', 'parked', 't', 'k', '')`)
	exec(`INSERT INTO inbox_quarantine (consumer, kind, message_id, topic, reason, payload, payload_sha256)
		VALUES ('shipping', 'dead_letter', 'dead', 't', 'boom', '', '\x00')`)
	msg := message.NewMessage("mine", []byte("x"))
	msg.SetContext(b.ctx)
	_, err := in.Middleware(b.handler.handle)(msg)
	require.NoError(t, err)
	count := func() int {
		return scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = 'shipping'`)
	}

	list, err := inboxadmin.New(b.pool).ListConsumers(b.ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, consumer, list[0].Consumer)
	require.Equal(t, "shipping", list[1].Consumer)
	require.Equal(t, [3]int64{1, 1, 1}, [3]int64{list[1].OpenQuarantined, list[1].HeldKeys, list[1].Parked})
	require.NotNil(t, list[1].LastProcessed)
	require.WithinDuration(t, time.Now(), *list[1].LastProcessed, time.Minute)

	retire := func(r inboxadmin.RetireParams) (inboxadmin.Retired, error) {
		r.Consumer = "shipping"
		return inboxadmin.New(b.pool).Retire(b.ctx, r)
	}
	_, err = inboxadmin.New(b.pool).Retire(b.ctx, inboxadmin.RetireParams{Consumer: "shiping", Idle: time.Hour})
	require.ErrorIs(t, err, inboxadmin.ErrNoSuchConsumer, "a typo")
	_, err = retire(inboxadmin.RetireParams{Idle: -time.Hour})
	require.ErrorContains(t, err, "negative Idle")
	// Each trace of activity alone refuses it: the newest row, a failed
	// attempt, a hold, a parked message.
	traces := []struct{ name, column, where string }{
		{"inbox_messages", "processed_at", "message_id = 'new'"},
		{"inbox_attempts", "updated_at", "true"},
		{"inbox_held_keys", "updated_at", "true"},
		{"inbox_parked", "parked_at", "true"},
	}
	for _, table := range traces {
		exec(`UPDATE ` + table.name + ` SET ` + table.column + ` = now() - interval '2 days' WHERE ` + table.where)
	}
	for _, table := range traces {
		exec(`UPDATE ` + table.name + ` SET ` + table.column + ` = now() WHERE ` + table.where)
		_, err = retire(inboxadmin.RetireParams{Idle: time.Hour, DropParked: true})
		require.ErrorIs(t, err, inboxadmin.ErrConsumerActive, "%s written just now", table.name)
		require.Equal(t, 25001, count(), "refused: nothing deleted")
		exec(`UPDATE ` + table.name + ` SET ` + table.column + ` = now() - interval '2 days' WHERE ` + table.where)
	}
	_, err = retire(inboxadmin.RetireParams{Idle: time.Hour})
	require.ErrorIs(t, err, inboxadmin.ErrParkedMessages)
	require.Equal(t, 25001, count(), "refused: nothing deleted")

	var progress []int64
	r, err := retire(inboxadmin.RetireParams{Idle: time.Hour, DropParked: true, Progress: func(n int64) { progress = append(progress, n) }})
	require.NoError(t, err)
	require.Equal(t, inboxadmin.Retired{Rows: 25001, Attempts: 1, HeldKeys: 1, Parked: 1, OpenQuarantined: 1}, r)
	require.Equal(t, []int64{10000, 20000, 25001}, progress, "a transaction per 10,000 rows")
	require.Zero(t, count())
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = $1`, consumer), "the other consumer's row stays")
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE consumer = 'shipping'`), "its quarantine stays")

	_, err = retire(inboxadmin.RetireParams{Idle: time.Hour})
	require.ErrorIs(t, err, inboxadmin.ErrNoSuchConsumer, "retired already")
	list, err = inboxadmin.New(b.pool).ListConsumers(b.ctx)
	require.NoError(t, err)
	require.Len(t, list, 2, "its open quarantine is still listed")
	require.Nil(t, list[1].LastProcessed)
}

// TestRetiredConsumerReleasesItsPartitions: a partition where a consumer
// that no longer runs has rows is never dropped (it will never clear it);
// once that consumer is retired, its rows gone from every partition, the
// next sweep drops it.
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
	// More of shipping's rows than one transaction deletes, in the first
	// partition, the dated one and the default one, and a clearance.
	_, err = b.pool.Exec(b.ctx, `
		INSERT INTO inbox_messages (consumer, message_id, payload_sha256, msg_time)
		SELECT 'shipping', 'm-' || g, '\x00', CASE g % 3 WHEN 0 THEN '-infinity'::timestamptz WHEN 1 THEN $1::timestamptz ELSE $2::timestamptz END
		FROM generate_series(1, 12000) g`, at, now.Add(30*day))
	require.NoError(t, err)
	require.Equal(t, 3, scalar[int](t, b, `SELECT count(DISTINCT tableoid) FROM inbox_messages WHERE consumer = 'shipping' AND message_id LIKE 'm-%'`))
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '3 days';
		INSERT INTO inbox_partitions_cleared (partition, consumer, slack) VALUES ('inbox_messages_p20000101t0000', 'shipping', '1 hour')`)
	require.NoError(t, err)
	partition := "inbox_messages_p" + at.Truncate(day).Format("20060102t1504")
	table := func() bool {
		return scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)`, partition)
	}
	require.True(t, table())

	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.True(t, table(), "shipping has rows there and has not cleared it")
	r, err := inboxadmin.New(b.pool).Retire(b.ctx, inboxadmin.RetireParams{Consumer: "shipping", Idle: time.Hour})
	require.NoError(t, err)
	require.Equal(t, inboxadmin.Retired{Rows: 12001, Clearances: 1}, r)
	require.Zero(t, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE consumer = 'shipping'`))
	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.False(t, table(), "shipping retired: the partition goes")
}
