package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// partitionsOf lists outbox_messages's partitions in id order.
func partitionsOf(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox_messages'::regclass
		ORDER BY substring(pg_get_expr(c.relpartbound, c.oid) from 'TO \(''(-?[0-9]+)''\)')::bigint`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func partitionName(start time.Time) string {
	return "outbox_messages_p" + start.UTC().Format("20060102t1504")
}

// firstHour is the start of the interval of the first partition after
// the first: the hour PartitionByTime ran in.
func firstHour(t testing.TB, pool *pgxpool.Pool) time.Time {
	t.Helper()
	parts := partitionsOf(t, pool)
	require.GreaterOrEqual(t, len(parts), 2)
	start, err := time.Parse("outbox_messages_p20060102t1504", parts[1])
	require.NoError(t, err)
	return start
}

// insertPublished writes n rows of history to topic, published ago, with
// plain SQL.
func insertPublished(t testing.TB, pool *pgxpool.Pool, topic string, n int, ago time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		INSERT INTO outbox_messages (message_id, topic, payload, published_at)
		SELECT gen_random_uuid(), $1, '\x00', now() - $3::interval FROM generate_series(1, $2)`, topic, n, ago)
	require.NoError(t, err)
}

// idOf returns the outbox id of msg's row.
func idOf(t testing.TB, pool *pgxpool.Pool, msg *message.Message) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT id FROM outbox_messages WHERE message_id = $1`, msg.UUID).Scan(&id))
	return id
}

// TestPartitionByTimeKeepsEveryRowAndItsOrder: a table with published,
// pending and parked rows is converted while producers write to it; the
// relay then publishes every pending row once, each key's rows in the
// order they were written across the conversion, and the row behind a
// parked one only after it.
func TestPartitionByTimeKeepsEveryRowAndItsOrder(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool

	// Old published rows, to be kept in the first partition as they are.
	insertPublished(t, pool, bundle.topic, 5000, 2*time.Hour)
	// A parked row, and one of its key behind it.
	parked := outbox.NewMessage("held", []byte("parked"))
	insertRow(t, pool, bundle.topic, parked)
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET parked_at = now(), park_reason = 'test' WHERE message_id = $1`, parked.UUID)
	require.NoError(t, err)
	behind := outbox.NewMessage("held", []byte("behind"))
	publishCommitted(t, pool, bundle.topic, behind)

	// Producers write, key by key, before, during and after the conversion.
	keys := []string{"a", "b", "c", "d"}
	var mu sync.Mutex
	var written []*message.Message
	write := func(k string) error {
		msg := outbox.NewMessage(k, []byte(k))
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.PublishTx(ctx, tx, bundle.topic, msg) })
		if err == nil {
			mu.Lock()
			written = append(written, msg)
			mu.Unlock()
		}
		return err
	}
	for _, k := range keys {
		require.NoError(t, write(k))
	}
	stop := make(chan struct{})
	producers := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			for {
				select {
				case <-stop:
					producers <- nil
					return
				default:
				}
				if err := write(k); err != nil {
					producers <- fmt.Errorf("writing during the conversion: %w", err)
					return
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(written) }
	for n := count(); count() < n+20; {
		time.Sleep(time.Millisecond) // the producers are under way
	}
	p := outbox.Partitioning{Interval: time.Hour}
	before := count()
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p))
	require.Greater(t, count(), before, "no producer wrote while the table was converted")
	for n := count(); count() < n+20; {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	for range keys {
		require.NoError(t, <-producers)
	}
	for _, k := range keys {
		require.NoError(t, write(k))
	}
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p), "converting a partitioned table again failed")

	// The first partition, then consecutive hours from the conversion's:
	// four, or five when an hour turned during the test.
	hour := firstHour(t, pool)
	parts := partitionsOf(t, pool)
	require.Equal(t, "outbox_messages_before_cut", parts[0])
	require.Contains(t, []int{5, 6}, len(parts), "partitions: %v", parts)
	for i, name := range parts[1:] {
		require.Equal(t, partitionName(hour.Add(time.Duration(i)*time.Hour)), name)
	}
	require.Less(t, idOf(t, pool, written[0]), int64(outbox.PartitionIDs), "a row from before the conversion moved")
	require.GreaterOrEqual(t, idOf(t, pool, written[len(written)-1]), int64(outbox.PartitionIDs),
		"a row written after the conversion is not in the current partition's block")

	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: bundle.pub, Partitions: &p})
	startRelay(t, relay)
	bundle.sink.WaitFor(t, ids(written))
	require.NoError(t, outboxadmin.New(pool).Retry(ctx, idOf(t, pool, parked)))
	bundle.sink.WaitFor(t, []string{parked.UUID, behind.UUID})

	// Every message once, each key's in the order written.
	counts := bundle.sink.Counts()
	order := map[string][]string{}
	for _, r := range bundle.sink.Records() {
		order[string(r.Key)] = append(order[string(r.Key)], messageID(r))
	}
	for _, m := range append(written, parked, behind) {
		require.Equal(t, 1, counts[m.UUID], "message %s published %d times", m.UUID, counts[m.UUID])
	}
	want := map[string][]string{"held": {parked.UUID, behind.UUID}}
	for _, m := range written {
		k := m.Metadata.Get(outbox.KeyMetadata)
		want[k] = append(want[k], m.UUID)
	}
	require.Equal(t, want, order)
	require.Equal(t, 5000, countRows(t, pool, "published_at < now() - interval '1 hour'"), "an old row was lost")
}

// TestPartitionRetentionDropsWhatIsRetired: the relay's round moves the ids
// to the current interval's partition, forward only, and drops a partition
// only once the ids have left it and every row in it is published and past
// Retention: not one with a pending row, a recently published row or a
// parked row (each alone in its partition, so each guard is seen by
// itself), nor the current one.
func TestPartitionRetentionDropsWhatIsRetired(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	p := outbox.Partitioning{Interval: time.Hour, Ahead: 2}
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p))
	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: bundle.pub, Partitions: &p, Retention: time.Hour})

	t0 := firstHour(t, pool)
	hour := func(h int) string { return partitionName(t0.Add(time.Duration(h) * time.Hour)) }
	// write returns a committed row's id, published ago (or pending: -1).
	write := func(key string, ago time.Duration) int64 {
		msg := outbox.NewMessage(key, nil)
		publishCommitted(t, pool, bundle.topic, msg)
		if ago >= 0 {
			_, err := pool.Exec(ctx, `UPDATE outbox_messages SET published_at = now() - $2::interval WHERE message_id = $1`, msg.UUID, ago)
			require.NoError(t, err)
		}
		return idOf(t, pool, msg)
	}
	round := func(h int) []string {
		dropped, err := relay.RetirePartitionsAt(ctx, t0.Add(time.Duration(h)*time.Hour+time.Minute))
		require.NoError(t, err)
		return dropped
	}

	// Hour 0: the current partition, all published long ago, is kept: the
	// ids are still in it. The first goes: the ids have left it, and the
	// table was empty.
	id0 := write("h0", 2*time.Hour)
	require.Equal(t, []string{"outbox_messages_before_cut"}, round(0))
	require.Equal(t, int64(outbox.PartitionIDs), id0/outbox.PartitionIDs*outbox.PartitionIDs)

	// Hour 1: the ids move on, and hour 0's partition goes.
	require.Equal(t, []string{hour(0)}, round(1))
	id1 := write("h1-pending", -1)
	require.Equal(t, id0/outbox.PartitionIDs+1, id1/outbox.PartitionIDs, "the ids did not move to hour 1's block")
	write("h1", 2*time.Hour)

	// Hour 2: hour 1's partition holds a pending row: kept.
	require.Empty(t, round(2))
	write("h2-recent", 30*time.Minute) // within Retention
	write("h2", 2*time.Hour)

	// Hour 3: hour 2's holds a row published within Retention: kept.
	require.Empty(t, round(3))
	id3 := write("h3-parked", -1)
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET parked_at = now(), park_reason = 'test' WHERE partition_key = 'h3-parked'`)
	require.NoError(t, err)
	write("h3", 2*time.Hour)

	// Hour 4: hour 3's holds a parked row: kept, as are 1's and 2's.
	require.Empty(t, round(4))
	require.Equal(t, []string{hour(1), hour(2), hour(3), hour(4), hour(5), hour(6)}, partitionsOf(t, pool))
	// A round from an earlier hour (a relay behind the others) moves no id back.
	require.Empty(t, round(1))
	id4 := write("h4", 2*time.Hour)
	require.Equal(t, id3/outbox.PartitionIDs+1, id4/outbox.PartitionIDs, "the ids moved back")

	// Published past Retention: hours 1 and 2 go; the parked row keeps 3.
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET published_at = now() - interval '2 hours'
		WHERE partition_key IN ('h1-pending', 'h2-recent')`)
	require.NoError(t, err)
	require.Equal(t, []string{hour(1), hour(2)}, round(4))
	// Retried and published: 3 goes. The current one stays, all published
	// as it is.
	_, err = pool.Exec(ctx, `UPDATE outbox_messages SET published_at = now() - interval '2 hours', parked_at = NULL
		WHERE partition_key = 'h3-parked'`)
	require.NoError(t, err)
	require.Equal(t, []string{hour(3)}, round(4))
	require.Equal(t, []string{hour(4), hour(5), hour(6)}, partitionsOf(t, pool))
	require.Equal(t, 1, countRows(t, pool, "true"))
}

// TestPartitionDropWaitsForAnOpenWriter: a transaction that wrote a row
// into a partition before the ids left it, and has not committed, is not
// seen by the round's first look; the drop must wait for it and look again,
// and keep the partition with its row.
func TestPartitionDropWaitsForAnOpenWriter(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	// A pending row keeps the first partition, so the round's first look
	// at the next one is what meets the open writer.
	early := outbox.NewMessage("early", nil)
	publishCommitted(t, pool, bundle.topic, early)
	p := outbox.Partitioning{Interval: time.Hour, LockTimeout: 10 * time.Second}
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p))
	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: bundle.pub, Partitions: &p, Retention: time.Hour})
	t0 := firstHour(t, pool)

	late := outbox.NewMessage("late", nil)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	require.NoError(t, outbox.PublishTx(ctx, tx, bundle.topic, late))

	type result struct {
		dropped []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		dropped, err := relay.RetirePartitionsAt(ctx, t0.Add(time.Hour+time.Minute))
		done <- result{dropped, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("the round did not wait for the open writer: dropped %v, err %v", r.dropped, r.err)
	case <-time.After(time.Second):
	}
	require.NoError(t, tx.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Empty(t, r.dropped, "the open writer's partition was dropped")
	require.Contains(t, partitionsOf(t, pool), partitionName(t0))

	startRelay(t, relay)
	bundle.sink.WaitFor(t, []string{early.UUID, late.UUID})
}

// TestRelayRefusesAnUnpartitionedTable: Partitions on a plain table is
// refused at Run, before anything is published.
func TestRelayRefusesAnUnpartitionedTable(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, Partitions: &outbox.Partitioning{}})
	err := relay.Run(ctx)
	require.ErrorContains(t, err, "run PartitionByTime")
	require.False(t, errors.Is(err, outbox.ErrRunning))
}

// TestPartitionClaimLooksInTheClaimedPartitionsOnly: the claim's update
// finds its rows by id in the partitions that hold them; the others, the
// first partition with every row it kept among them, are pruned when the
// statement runs.
func TestPartitionClaimLooksInTheClaimedPartitionsOnly(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	insertPublished(t, pool, bundle.topic, 2000, 0)
	require.NoError(t, outbox.PartitionByTime(ctx, pool, outbox.Partitioning{Interval: time.Hour}))
	for range 3 {
		publishCommitted(t, pool, bundle.topic, outbox.NewMessage("k", nil))
	}
	plan, err := outbox.ExplainClaim(ctx, pool, 10)
	require.NoError(t, err)
	require.Contains(t, plan, "rows=3 loops=1", "the claim found no rows:\n%s", plan)
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "on outbox_messages_before_cut outbox_messages_1 (") { // the update's look-up
			require.Contains(t, line, "never executed", "the claim looked in the first partition:\n%s", plan)
			return
		}
	}
	t.Fatalf("the claim's plan has no look-up by id in the first partition:\n%s", plan)
}

// TestPartitionByTimeKeepsTheGrants: a role producers log in as, granted
// INSERT on the table (and on its keys' counters, which PublishTx updates),
// still writes after the conversion (the new table has the old one's
// grants; access through it is checked there only).
func TestPartitionByTimeKeepsTheGrants(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	role := "outbox_writer_" + randomSuffix()
	watcher := "outbox_watcher_" + randomSuffix() // may read some columns only: a dashboard's role
	_, err := pool.Exec(ctx, `CREATE ROLE `+role+`; GRANT SELECT, INSERT ON outbox_messages TO `+role+`;
		GRANT SELECT, INSERT, UPDATE ON outbox_key_sequences TO `+role+`; GRANT SELECT ON outbox_stream TO `+role+`;
		CREATE ROLE `+watcher+`; GRANT SELECT (id, published_at) ON outbox_messages TO `+watcher)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP OWNED BY `+role+`, `+watcher+`; DROP ROLE `+role+`, `+watcher)
		require.NoError(t, err)
	})
	require.NoError(t, outbox.PartitionByTime(ctx, pool, outbox.Partitioning{Interval: time.Hour}))

	asRole := func(name, sql string) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+name); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}
	require.NoError(t, asRole(watcher, `SELECT id, published_at FROM outbox_messages`), "the column grants were lost in the conversion")
	require.ErrorContains(t, asRole(watcher, `SELECT payload FROM outbox_messages`), "permission denied",
		"a column grant became more than it was")

	msg := outbox.NewMessage("k", nil)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, bundle.topic, msg)
	})
	require.NoError(t, err, "the role lost its grant in the conversion")
	require.Equal(t, 1, countRows(t, pool, "true"))
}

// TestPartitioningNeedsALockTimeout: Postgres takes lock_timeout in
// milliseconds and 0 as none, so a LockTimeout under a millisecond would
// let a drop wait for the longest transaction, every producer behind it.
func TestPartitioningNeedsALockTimeout(t *testing.T) {
	t.Parallel()
	_, err := outbox.NewRelay(outbox.RelayConfig{Pool: &pgxpool.Pool{}, Publisher: countingPublisher{},
		Partitions: &outbox.Partitioning{LockTimeout: time.Microsecond}})
	require.ErrorContains(t, err, "LockTimeout must be at least 1ms")
}

// TestPartitionRoundsTakeTurns: while another session holds the schema's
// partition lock (another relay's round, a conversion), a round does
// nothing and says nothing went wrong; once it is free, the round works.
func TestPartitionRoundsTakeTurns(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	p := outbox.Partitioning{Interval: time.Hour}
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p))
	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: bundle.pub, Partitions: &p})

	other, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer other.Release()
	_, err = other.Exec(ctx, `SELECT pg_advisory_lock(7412006, hashtext(current_schema()))`)
	require.NoError(t, err)
	dropped, err := relay.RetirePartitions(ctx)
	require.NoError(t, err)
	require.Empty(t, dropped, "a round ran while another held the lock")

	_, err = other.Exec(ctx, `SELECT pg_advisory_unlock(7412006, hashtext(current_schema()))`)
	require.NoError(t, err)
	dropped, err = relay.RetirePartitions(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"outbox_messages_before_cut"}, dropped, "the empty first partition, which the ids have left")
}

// TestPartitionShardedRelaysAcrossTheCut: sharded relays on a partitioned
// outbox publish the rows written before the conversion (in the first
// partition) and after it (in the current one), every message, each key's
// in commit order across the two partitions, each row marked once.
func TestPartitionShardedRelaysAcrossTheCut(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	const producers, txs, msgs, keys = 4, 20, 4, 6
	halfway := make(chan struct{})
	written := writeKeyedAsync(t, ctx, bundle, "", producers, txs, msgs, keys, halfway)
	eventually(t, waitTimeout, func() bool { return countRows(t, pool, "true") == producers*txs*msgs/2 },
		"the first half of the rows was never written")

	p := outbox.Partitioning{Interval: time.Hour}
	require.NoError(t, outbox.PartitionByTime(ctx, pool, p))
	var relays []*outbox.Relay
	for _, id := range []string{"a", "b"} {
		cfg := shardedConfig(bundle, newPublisher(t), id)
		cfg.Partitions = &p
		relays = append(relays, newRelay(t, cfg))
		startRelay(t, relays[len(relays)-1])
	}
	close(halfway)
	want := <-written

	bundle.sink.WaitFor(t, want)
	eventually(t, waitTimeout, func() bool { return countRows(t, pool, "published_at IS NULL") == 0 },
		"rows still unmarked after their messages reached Kafka")
	var before, after int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE tableoid = 'outbox_messages_before_cut'::regclass),
		       count(*) FILTER (WHERE tableoid <> 'outbox_messages_before_cut'::regclass)
		FROM outbox_messages`).Scan(&before, &after))
	require.Equal(t, []int{len(want) / 2, len(want) / 2}, []int{before, after},
		"the rows are not half in the first partition, half after the cut")
	eventually(t, waitTimeout, func() bool { return relays[0].Stats().Published+relays[1].Stats().Published >= int64(len(want)) },
		"the relays' counts never reached the rows marked")
	require.Equal(t, int64(len(want)), relays[0].Stats().Published+relays[1].Stats().Published, "a row was marked by two relays")
	require.Len(t, requireKeyOrder(t, bundle.sink.Records()), producers*keys)
}
