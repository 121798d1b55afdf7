package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestCommitOrderPerKey: two transactions write a message for one key
// without any lock of their own; the one that wrote first commits last.
// Kafka must get the key's messages in commit order. Before the per-key
// lock, ids were taken at INSERT, the relay sent by id, and Kafka got them
// in write order: [first, second] for commits [second, first].
func TestCommitOrderPerKey(t *testing.T) {
	t.Parallel()
	t.Run("KeyLock", func(t *testing.T) {
		t.Parallel()
		commits, got := reversedCommits(t, outbox.Writer{})
		require.Equal(t, commits, got, "Kafka's order for the key is not its commit order")
	})
	// The control: without the lock the second writer commits first, and
	// Kafka gets the write order. The test can see the reversal.
	t.Run("UnorderedControl", func(t *testing.T) {
		t.Parallel()
		commits, got := reversedCommits(t, outbox.Writer{Unordered: true})
		require.Equal(t, []int{2, 1}, commits)
		require.Equal(t, []int{1, 2}, got)
	})
}

// reversedCommits has two transactions write a message each for key "k"
// through w, the first writer committing as late as it can, and returns the
// messages' sequence numbers in commit order and in Kafka's order.
func reversedCommits(t *testing.T, w outbox.Writer) (commits, got []int) {
	ctx := t.Context()
	pool, topic := newPool(t), newTopic(t)
	sink := newSink(t, topic)

	var mu sync.Mutex
	committed := func(seq int) {
		mu.Lock()
		defer mu.Unlock()
		commits = append(commits, seq)
	}

	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Rollback(context.Background()) })
	require.NoError(t, w.PublishTx(ctx, first, topic, newKeyedMessage("k", 1)))

	// The second writer tries to commit while the first is open. If
	// PublishTx lets it, it commits first; if it waits for the first writer,
	// the test lets the first one commit once the second is seen waiting.
	second := make(chan error, 1)
	go func() {
		err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			return w.PublishTx(ctx, tx, topic, newKeyedMessage("k", 2))
		})
		committed(2) // before it is seen: the loop below records the first's commit next
		second <- err
	}()
	waiting := false
	for deadline := time.Now().Add(waitTimeout); !waiting && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-second:
			require.NoError(t, err)
			second <- nil // the second writer committed without waiting
			waiting = true
			continue
		default:
		}
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		waiting = n > 0
	}
	require.True(t, waiting, "the second writer neither committed nor waited")
	// Recorded before the commit: a second writer the lock holds can only
	// commit after it, and one that did not wait has recorded its commit
	// already. Recorded after, the second writer, released by this
	// commit, could record first on a loaded machine (CI saw [2 1] with
	// Kafka's [1 2]).
	committed(1)
	require.NoError(t, first.Commit(ctx))
	require.NoError(t, <-second)

	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: newPublisher(t)})
	startRelay(t, relay)
	eventually(t, waitTimeout, func() bool { return len(sink.Records()) >= 2 })

	for _, r := range sink.Records() {
		var p payload
		require.NoError(t, json.Unmarshal(r.Value, &p))
		got = append(got, p.Seq)
	}
	mu.Lock()
	defer mu.Unlock()
	return commits, got
}

// TestRelayRefusesACachedIDSequence: with CACHE above 1 on the id sequence,
// each session takes ids from a range of its own, so a key's second
// message, committed after its first, can hold the lower id, and the relay
// (which sends in id order) would send it first. Run refuses to start, and
// publishes nothing.
func TestRelayRefusesACachedIDSequence(t *testing.T) {
	t.Parallel()
	ctx, bundle := setupRelay(t)
	pool := bundle.pool
	_, err := pool.Exec(ctx, `ALTER TABLE outbox_messages ALTER COLUMN id SET CACHE 20`)
	require.NoError(t, err)
	a, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer a.Release()
	b, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer b.Release()
	publishOn := func(conn interface {
		Begin(context.Context) (pgx.Tx, error)
	}, msg *message.Message) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, outbox.PublishTx(ctx, tx, bundle.topic, msg))
		require.NoError(t, tx.Commit(ctx))
	}
	publishOn(b, newKeyedMessage("other-b", 0)) // b's session takes a range of ids first
	publishOn(a, newKeyedMessage("other-a", 0)) // a's the next one
	first, second := newKeyedMessage("k", 0), newKeyedMessage("k", 1)
	publishOn(a, first)
	publishOn(b, second) // committed after first, from the lower range
	require.Less(t, idOf(t, pool, second), idOf(t, pool, first), "the cached ids followed commit order after all")

	runCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: bundle.pub}).Run(runCtx)
	require.ErrorIs(t, err, outbox.ErrIDCache)
	require.ErrorContains(t, err, "has CACHE 20")
	require.ErrorContains(t, err, "ALTER SEQUENCE outbox_messages_id_seq CACHE 1")
	require.Equal(t, 4, countRows(t, pool, "published_at IS NULL"), "the relay published before refusing")

	// A relay that starts while its database does not answer yet is
	// checked once it does, and refused all the same.
	var down atomic.Bool
	down.Store(true)
	cfg := pool.Config()
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if down.Load() {
			return errors.New("the database is not up yet")
		}
		return nil
	}
	late, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer late.Close()
	done := make(chan error, 1)
	go func() {
		done <- newRelay(t, outbox.RelayConfig{Pool: late, Publisher: bundle.pub, ErrorBackoff: 20 * time.Millisecond}).Run(runCtx)
	}()
	time.Sleep(200 * time.Millisecond) // a few checks fail
	down.Store(false)
	require.ErrorIs(t, <-done, outbox.ErrIDCache, "the relay ran unchecked after its database came up")
}
