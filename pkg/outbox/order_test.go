package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
