package inbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestRun: Run owns the batch workers and the sweep. Before it runs and
// after it returned, deliveries are applied one transaction each; while it
// runs they share transactions; when its context ends it returns only after
// the batch in flight committed; a second Run is refused; it sweeps every
// RetentionInterval.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	pool := newTestDB(t, ctx)
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer, BatchSize: 16, BatchWorkers: 1,
		BatchLinger: 100 * time.Millisecond, Retention: time.Hour, RedeliveryHorizon: time.Hour, RetentionInterval: 50 * time.Millisecond})
	require.NoError(t, err)

	// The handler records the transaction each message was applied in, and
	// waits at gate when it is set.
	var mu sync.Mutex
	var gate chan struct{}
	entered := make(chan struct{}, 64)
	h := in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		mu.Lock()
		g := gate
		mu.Unlock()
		if g != nil {
			entered <- struct{}{}
			<-g
		}
		for _, m := range msgs {
			if _, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, txid_current()::int)`, consumer, m.UUID); err != nil {
				return err
			}
		}
		return nil
	})
	// deliverAll delivers n new messages at once and returns how many
	// transactions applied them.
	deliverAll := func(n int) int {
		t.Helper()
		ids := make([]string, n)
		var wg sync.WaitGroup
		for i := range ids {
			ids[i] = newID()
			wg.Go(func() {
				msg := message.NewMessage(ids[i], []byte(`{}`))
				msg.SetContext(ctx)
				if err := h(msg); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var txs int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT n), count(*) FROM applied WHERE message_id = ANY($1)`, ids).Scan(&txs, new(int)))
		require.Equal(t, n, scalar[int](t, &testBundle{ctx: ctx, pool: pool}, `SELECT count(*) FROM applied WHERE message_id = ANY($1)`, ids))
		return txs
	}

	require.Equal(t, 8, deliverAll(8), "before Run: one transaction per delivery")

	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- in.Run(runCtx) }()
	require.Eventually(t, in.Running, 10*time.Second, time.Millisecond, "Run did not start")
	require.Less(t, deliverAll(16), 16, "while Run runs, deliveries that arrive together share transactions")
	require.ErrorIs(t, in.Run(ctx), inbox.ErrRunning, "a second Run must be refused while the first runs")

	// A batch held in the handler while Run's context ends: Run waits for it.
	mu.Lock()
	gate = make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	mu.Unlock()
	t.Cleanup(release) // a failed check below must not leave deliveries waiting
	// One batch is held in the handler; behind it, with the one worker
	// busy, three more deliveries wait in the queue when Run's context
	// ends: they must still be run, as batches of their own, not dropped
	// and not padded out.
	held := make(chan int, 1)
	go func() { held <- deliverAll(1) }()
	<-entered // the batch is in the handler
	queued := make(chan int, 1)
	go func() { queued <- deliverAll(3) }()
	time.Sleep(200 * time.Millisecond) // for them to reach the queue (nothing reports it)
	stop()
	select {
	case err := <-runErr:
		t.Fatalf("Run returned (%v) while its batch was still in the handler", err)
	case <-time.After(300 * time.Millisecond):
	}
	mu.Lock()
	release()
	gate = nil
	mu.Unlock()
	require.NoError(t, <-runErr)
	require.False(t, in.Running())
	<-held // every delivery of the held batch was answered, applied
	<-queued
	require.Equal(t, 8, deliverAll(8), "after Run returned: one transaction per delivery")

	// The sweep: a row past Retention goes within a few intervals.
	_, err = pool.Exec(ctx, `UPDATE inbox_messages SET processed_at = now() - interval '2 hours'`)
	require.NoError(t, err)
	sweepCtx, stopSweep := context.WithCancel(ctx)
	go func() { runErr <- in.Run(sweepCtx) }()
	require.Eventually(t, func() bool {
		return scalar[int](t, &testBundle{ctx: ctx, pool: pool}, `SELECT count(*) FROM inbox_messages`) == 0
	}, 10*time.Second, 20*time.Millisecond, "Run did not sweep every RetentionInterval")
	stopSweep()
	require.NoError(t, <-runErr)
}
