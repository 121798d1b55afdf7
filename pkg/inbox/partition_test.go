package inbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// idAt returns a fresh UUIDv7 carrying t as its creation time.
func idAt(t time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := t.UnixMilli()
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

func TestUUIDv7Time(t *testing.T) {
	at := time.Date(2026, 11, 26, 13, 4, 5, 678_000_000, time.UTC)
	got, err := inbox.UUIDv7Time(idAt(at))
	require.NoError(t, err)
	require.Equal(t, at, got)
	for _, id := range []string{uuid.NewString(), "", "not-a-uuid", "{" + idAt(at) + "}"} {
		_, err := inbox.UUIDv7Time(id)
		require.Error(t, err, id)
	}
	upper := []byte(idAt(at))
	for i, c := range upper {
		if c >= 'a' && c <= 'f' {
			upper[i] = c - 'a' + 'A'
		}
	}
	_, err = inbox.UUIDv7Time(string(upper))
	require.Error(t, err, "an id in another spelling is another key: refused")
}

// partitionOf names the partition holding consumer's row of id.
func partitionOf(t *testing.T, b *testBundle, id string) string {
	t.Helper()
	return scalar[string](t, b, `SELECT tableoid::regclass::text FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, id)
}

// TestPartitionByIDTimeKeepsEveryCopyOut converts an inbox holding rows into
// a partitioned one, then delivers every message again: each is a duplicate,
// applied once. Among them, a message whose id carries a time past the
// cut-over (a producer's clock ahead): its row is in the first partition,
// with no time, while its copy's time points to a later partition.
func TestPartitionByIDTimeKeepsEveryCopyOut(t *testing.T) {
	plain, b := setup(t, inbox.Config{})
	mw := plain.Middleware(b.handler.handle)
	now := time.Now()
	var ids []string
	for i := range 20 {
		ids = append(ids, idAt(now.Add(-time.Duration(i)*time.Minute)))
	}
	ahead := idAt(now.Add(10 * 24 * time.Hour)) // past any cut-over
	v4 := uuid.NewString()                      // no time at all
	ids = append(ids, ahead, v4)
	for _, id := range ids {
		require.NoError(t, deliver(b.ctx, mw, id, []byte("p-"+id)))
	}
	// Many more rows, as a table that has run for a while holds.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256)
		SELECT $1, 'old-' || g, '\x00' FROM generate_series(1, 20000) g`, consumer)
	require.NoError(t, err)

	p := inbox.Partitioning{Interval: time.Hour, Ahead: 4}
	cutOver := now.Add(2 * time.Hour) // rounded up to the hour: the first hour's partition starts there
	firstHour := cutOver.UTC().Truncate(time.Hour).Add(time.Hour)
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, cutOver))
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, cutOver), "a second call leaves the partitioned table as it is")
	require.Equal(t, 20022, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`), "every row kept, none copied")
	require.Equal(t, "inbox_messages_before_cut", partitionOf(t, b, ids[0]))

	cfg := inbox.Config{Partitions: &p}
	in := b.newInbox(t, cfg)
	runInbox(t, in) // Run accepts the partitioned table
	pmw := in.Middleware(b.handler.handle)
	for _, id := range ids[:len(ids)-1] {
		require.NoError(t, deliver(b.ctx, pmw, id, []byte("p-"+id)))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id), id)
		require.Equal(t, 1, appliedRows(t, b, consumer, id), id)
	}
	require.NoError(t, deliver(b.ctx, pmw, v4, []byte("p-"+v4)))
	require.Equal(t, inbox.Invalid, b.events.last(t).Outcome, "an id with no time cannot be placed")

	// New messages go to the partition of their id's time.
	later := idAt(firstHour.Add(30 * time.Minute))
	before := idAt(now.Add(time.Minute))
	for _, id := range []string{later, before} {
		require.NoError(t, deliver(b.ctx, pmw, id, []byte("p-"+id)))
		require.NoError(t, deliver(b.ctx, pmw, id, []byte("p-"+id)))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id), id)
	}
	require.Equal(t, "inbox_messages_before_cut", partitionOf(t, b, before))
	require.Equal(t, "inbox_messages_p"+firstHour.Format("20060102t1504"), partitionOf(t, b, later))
}

// TestRunRefusesATableOfAnotherShape: writes with a time to a plain table
// fail, and writes without one to a partitioned table all pile into one
// partition.
func TestRunRefusesATableOfAnotherShape(t *testing.T) {
	p := inbox.Partitioning{}
	in, b := setup(t, inbox.Config{Partitions: &p})
	require.ErrorContains(t, in.Run(b.ctx), "run PartitionByIDTime")
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, time.Time{}))
	plain := b.newInbox(t, inbox.Config{})
	require.ErrorContains(t, plain.Run(b.ctx), "Config.Partitions is not set")
	// Behind the middleware alone, without Run: no row written, nothing
	// applied, the delivery fails with the reason (and comes again).
	other := b.newInbox(t, inbox.Config{Consumer: "other"})
	id := idAt(time.Now())
	require.ErrorContains(t, deliver(b.ctx, other.Middleware(b.handler.handle), id, []byte("x")), "Config.Partitions is not set")
	require.Zero(t, scalar[int](t, b, `SELECT count(*) FROM applied`))
	require.Zero(t, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
}

// TestPartitionLateCopyTakesBackTheClearance: a consumer cleared a
// partition, then a copy of one of its messages came at an offset Kafka
// still holds. The partition stays (a crash before that copy's offset is
// committed delivers it again), until its rows are judged again.
func TestPartitionLateCopyTakesBackTheClearance(t *testing.T) {
	day := 24 * time.Hour
	p := inbox.Partitioning{Interval: day, Ahead: 1}
	logStart := inbox.LogStart{"": {0: 10}}
	position := func(m *message.Message) (int32, int64, bool) {
		off, err := strconv.ParseInt(m.Metadata.Get("offset"), 10, 64)
		return 0, off, err == nil
	}
	cfg := inbox.Config{Partitions: &p, Retention: day, RedeliveryHorizon: day, Position: position,
		LogStart: func(context.Context) (inbox.LogStart, error) { return logStart, nil }}
	_, b := setup(t, inbox.Config{})
	now := time.Now().UTC()
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, now.Add(-10*day)))
	_, err := inbox.MakePartitionsAt(b.ctx, b.pool, p, now.Add(-6*day))
	require.NoError(t, err)
	in := b.newInbox(t, cfg)
	shippingCfg := cfg
	shippingCfg.Consumer = "shipping"
	other := b.newInbox(t, shippingCfg)
	send := func(in *inbox.Inbox, id string, offset int) {
		msg := message.NewMessage(id, []byte("x"))
		msg.Metadata.Set("offset", strconv.Itoa(offset))
		msg.SetContext(b.ctx)
		_, err := in.Middleware(b.handler.handle)(msg)
		require.NoError(t, err)
	}
	at := now.Truncate(day).Add(-6*day + time.Hour)
	id := idAt(at)
	send(in, id, 5)
	send(other, idAt(at), 6)
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '3 days'`)
	require.NoError(t, err)
	exists := func() bool {
		return scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE message_id = $1)`, id)
	}

	_, err = in.Sweep(b.ctx) // billing clears it; shipping has not
	require.NoError(t, err)
	require.True(t, exists())
	send(in, id, 12) // a copy Kafka still holds
	require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id))
	_, err = other.Sweep(b.ctx) // shipping clears it, and would drop it on billing's old word
	require.NoError(t, err)
	require.True(t, exists(), "billing's clearance was taken back by the copy")
	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.True(t, exists(), "Kafka holds offset 12")
	logStart[""][0] = 13
	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.False(t, exists(), "judged again and cleared by both: dropped")
}

// TestPartitionRetentionDropsWhatNoOneNeeds: a partition goes only when
// every consumer with rows in it would sweep them all: past its retention,
// none parked, none that Kafka still holds; rows of the default partition
// go by DELETE. Each partition below is kept for one reason, then dropped
// once the reason is gone.
func TestPartitionRetentionDropsWhatNoOneNeeds(t *testing.T) {
	day := 24 * time.Hour
	p := inbox.Partitioning{Interval: day, Ahead: 1}
	logStart := inbox.LogStart{"": {0: 10}} // the topic a message delivered outside a router has
	cfg := inbox.Config{
		Partitions: &p, Retention: day, RedeliveryHorizon: day,
		LogStart: func(context.Context) (inbox.LogStart, error) { return logStart, nil },
		Position: func(m *message.Message) (int32, int64, bool) {
			off, err := strconv.ParseInt(m.Metadata.Get("offset"), 10, 64)
			return 0, off, err == nil
		},
	}
	_, b := setup(t, inbox.Config{})
	now := time.Now().UTC()
	cut := now.Truncate(day).Add(-10 * day)
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, cut))
	for d := 9; d >= 2; d-- { // the past days' partitions, as a table that has run for a while has them
		_, err := inbox.MakePartitionsAt(b.ctx, b.pool, inbox.Partitioning{Interval: day, Ahead: 1}, now.Add(-time.Duration(d)*day))
		require.NoError(t, err)
	}
	in := b.newInbox(t, cfg)
	other := b.newInbox(t, inbox.Config{Consumer: "shipping", Partitions: &p, Retention: day, RedeliveryHorizon: day})
	mw, omw := in.Middleware(b.handler.handle), other.Middleware(b.handler.handle)
	send := func(mw message.HandlerFunc, at time.Time, offset int) string {
		id := idAt(at)
		msg := message.NewMessage(id, []byte("x"))
		msg.Metadata.Set("offset", strconv.Itoa(offset))
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
		return id
	}
	dayAgo := func(d int) time.Time { return now.Truncate(day).Add(-time.Duration(d)*day + time.Hour) }
	plainDay := send(mw, dayAgo(8), 1)  // nothing keeps it
	sharedDay := send(mw, dayAgo(7), 2) // shipping has a row there too
	send(omw, dayAgo(7), 3)             //
	kafkaDay := send(mw, dayAgo(6), 10) // Kafka still holds offset 10
	recentDay := send(mw, dayAgo(5), 4) // processed an hour ago
	parkedDay := send(mw, dayAgo(4), 7) // parked: waits for its key's release
	oldID := send(mw, cut.Add(-day), 5) // older than the cut-over: the first partition
	age := func(id, by string) {
		_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - $2::interval WHERE message_id = $1`, id, by)
		require.NoError(t, err)
	}
	_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET status = 'parked' WHERE message_id = $1`, parkedDay)
	require.NoError(t, err)
	for _, id := range []string{plainDay, sharedDay, kafkaDay, oldID, parkedDay} {
		age(id, "3 days")
	}
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '3 days' WHERE consumer = 'shipping'`)
	require.NoError(t, err)
	age(recentDay, "1 hour")
	require.Equal(t, "inbox_messages_before_cut", partitionOf(t, b, oldID))

	exists := func(id string) bool {
		return scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE message_id = $1)`, id)
	}
	table := func(name string) bool {
		return scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)`, name)
	}
	n, err := in.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "no row deleted: whole partitions dropped")
	require.False(t, exists(plainDay), "its partition dropped")
	require.False(t, table("inbox_messages_p"+dayAgo(8).Truncate(day).Format("20060102t1504")))
	require.False(t, exists(oldID))
	require.False(t, table("inbox_messages_before_cut"), "the table as it was before the cut-over, dropped whole")
	require.True(t, exists(sharedDay), "shipping has not cleared the partition")
	require.True(t, exists(kafkaDay), "Kafka still holds a copy")
	require.True(t, exists(recentDay), "processed within retention")
	require.True(t, exists(parkedDay), "parked: not applied yet")
	require.True(t, table("inbox_messages_p"+dayAgo(9).Truncate(day).Format("20060102t1504")) == false, "an empty old partition goes too")

	// A message older than every partition left (a dead letter redriven
	// long after) waits in the default partition, and goes by DELETE.
	lateID := send(mw, cut.Add(-day), 6)
	require.Equal(t, "inbox_messages_default", partitionOf(t, b, lateID))
	age(lateID, "3 days")

	_, err = other.Sweep(b.ctx)
	require.NoError(t, err)
	require.False(t, exists(sharedDay), "both consumers cleared it: the last one dropped it")
	logStart[""][0] = 11
	n, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the default partition's row, by DELETE")
	require.False(t, exists(lateID))
	require.False(t, exists(kafkaDay), "Kafka's log start passed it")
	require.True(t, exists(recentDay))
}

// TestPartitionTakesInWhatArrivedAhead: a message whose id is ahead of the
// partitions made waits in the default partition, moves into its partition
// when that is made, and a copy of it is still a duplicate.
func TestPartitionTakesInWhatArrivedAhead(t *testing.T) {
	p := inbox.Partitioning{Interval: time.Hour, Ahead: 1}
	_, b := setup(t, inbox.Config{})
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, time.Now()))
	in := b.newInbox(t, inbox.Config{Partitions: &p})
	mw := in.Middleware(b.handler.handle)
	at := time.Now().Add(5 * time.Hour)
	id := idAt(at)
	require.NoError(t, deliver(b.ctx, mw, id, []byte("x")))
	require.Equal(t, "inbox_messages_default", partitionOf(t, b, id))
	made, err := inbox.MakePartitionsAt(b.ctx, b.pool, p, at)
	require.NoError(t, err)
	require.NotEmpty(t, made)
	require.Equal(t, "inbox_messages_p"+at.UTC().Truncate(time.Hour).Format("20060102t1504"), partitionOf(t, b, id))
	require.NoError(t, deliver(b.ctx, mw, id, []byte("x")))
	require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id))
	require.Equal(t, 1, appliedRows(t, b, consumer, id))
}

// TestPartitionByIDTimeDuringTheRollout: before the cut-over, a consumer not
// yet running with Config.Partitions writes its rows with no time, while a
// converted one writes the same message's row with its id's time: the two
// land in the first partition under different keys of the partitioned
// table. Its own (consumer, message_id) index makes the second wait for the
// first and see it: a duplicate, not a second apply.
func TestPartitionByIDTimeDuringTheRollout(t *testing.T) {
	p := inbox.Partitioning{Interval: time.Hour}
	_, b := setup(t, inbox.Config{})
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, time.Time{}))
	in := b.newInbox(t, inbox.Config{Partitions: &p})
	mw := in.Middleware(b.handler.handle)

	id, payload := idAt(time.Now()), []byte("x")
	tx, err := b.pool.Begin(b.ctx) // the consumer of the old version, mid-transaction
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(b.ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256) VALUES ($1, $2, $3)`, consumer, id, sha(payload))
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, 1)`, consumer, id)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- deliver(b.ctx, mw, id, payload) }()
	awaitLockWaiters(t, b, 1, "the converted consumer's insert to wait for the old one's row")
	require.NoError(t, tx.Commit(b.ctx))
	require.NoError(t, <-done)
	require.Equal(t, []inbox.Outcome{inbox.Duplicate}, b.events.outcomes(id))
	require.Equal(t, 1, appliedRows(t, b, consumer, id))
}

// TestPartitionDropKeepsTheLongestSlack: a row written after its consumer
// cleared the partition, by a transaction that began before (its
// processed_at is that start), keeps the partition for the slack of the
// consumer that wrote it, whichever consumer's sweep tries the drop: here
// billing's (an hour, its Retention being a day) and not shipping's (a
// minute, its Retention two).
func TestPartitionDropKeepsTheLongestSlack(t *testing.T) {
	day := 24 * time.Hour
	p := inbox.Partitioning{Interval: day, Ahead: 1}
	_, b := setup(t, inbox.Config{})
	now := time.Now().UTC()
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, p, now.Add(-10*day)))
	_, err := inbox.MakePartitionsAt(b.ctx, b.pool, p, now.Add(-6*day))
	require.NoError(t, err)
	billing := b.newInbox(t, inbox.Config{Partitions: &p, Retention: day, RedeliveryHorizon: day})
	shipping := b.newInbox(t, inbox.Config{Consumer: "shipping", Partitions: &p, Retention: 2 * time.Minute,
		RedeliveryHorizon: 2 * time.Minute, TxTimeout: 10 * time.Second})
	at := now.Truncate(day).Add(-6*day + time.Hour)
	require.NoError(t, deliver(b.ctx, billing.Middleware(b.handler.handle), idAt(at), []byte("x")))
	require.NoError(t, deliver(b.ctx, shipping.Middleware(b.handler.handle), idAt(at), []byte("x")))
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '3 days'`)
	require.NoError(t, err)
	_, err = billing.Sweep(b.ctx) // billing clears it; shipping has not
	require.NoError(t, err)
	late := idAt(at.Add(time.Minute)) // billing's, begun 30 minutes ago, committed after its clearance
	_, err = b.pool.Exec(b.ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256, msg_time, processed_at)
		VALUES ($1, $2, '\x00', $3, now() - interval '30 minutes')`, consumer, late, at.Add(time.Minute))
	require.NoError(t, err)
	_, err = shipping.Sweep(b.ctx) // shipping clears it, and tries the drop
	require.NoError(t, err)
	require.True(t, scalar[bool](t, b, `SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE message_id = $1)`, late),
		"a row written 30 minutes before the drop, within billing's hour")
}

// TestPartitionByIDTimeKeepsTheGrants: a role consumers log in as keeps,
// after the conversion, what it was granted on the table, on the new table
// and on the clearances its sweeps write.
func TestPartitionByIDTimeKeepsTheGrants(t *testing.T) {
	_, b := setup(t, inbox.Config{})
	role := fmt.Sprintf("inbox_consumer_%d_%d", os.Getpid(), time.Now().UnixNano())
	// A role granted some columns only, one of them a column the
	// clearances' table does not have.
	watcher := role + "_watcher"
	_, err := b.pool.Exec(b.ctx, `CREATE ROLE `+role+`; GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_messages TO `+role+`;
		CREATE ROLE `+watcher+`; GRANT SELECT (message_id, processed_at) ON inbox_messages TO `+watcher)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := b.pool.Exec(context.Background(), `DROP OWNED BY `+role+`, `+watcher+`; DROP ROLE `+role+`, `+watcher)
		require.NoError(t, err)
	})
	require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, inbox.Partitioning{}, time.Time{}))
	for _, table := range []string{"inbox_messages", "inbox_partitions_cleared"} {
		for _, priv := range []string{"SELECT", "INSERT", "UPDATE", "DELETE"} {
			require.True(t, scalar[bool](t, b, `SELECT has_table_privilege($1, $2, $3)`, role, table, priv),
				"the role lost %s on %s in the conversion", priv, table)
		}
	}
	for column, want := range map[string]bool{"message_id": true, "processed_at": true, "consumer": false} {
		require.Equal(t, want, scalar[bool](t, b, `SELECT has_column_privilege($1, 'inbox_messages', $2, 'SELECT')`, watcher, column),
			"the column-only role's SELECT on %s after the conversion", column)
	}
}

// TestPartitioningNeedsALockTimeout: Postgres takes lock_timeout in
// milliseconds and 0 as none, so a LockTimeout under a millisecond would
// let a drop wait for the longest transaction, every delivery behind it.
func TestPartitioningNeedsALockTimeout(t *testing.T) {
	_, err := inbox.New(inbox.Config{Pool: &pgxpool.Pool{}, Consumer: "c",
		Partitions: &inbox.Partitioning{LockTimeout: time.Microsecond}})
	require.ErrorContains(t, err, "LockTimeout must be at least 1ms")
}
