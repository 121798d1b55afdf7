package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestBatching delivers many messages at once to an inbox that batches: one
// poison message among them, a payload conflict and a redelivery. Each good
// message is applied exactly once, the poison one alone is retried and
// dead-lettered, and fewer transactions commit than messages.
func TestBatching(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{BatchSize: 8, BatchWorkers: 2, MaxAttempts: 2, RetryBackoff: time.Millisecond})
	poison := newID()
	b.handler.hook = func(msg *message.Message, _ int) error {
		if msg.UUID == poison {
			return errors.New("cannot apply")
		}
		return nil
	}
	mw := in.Middleware(b.handler.handle)
	seen := newID()
	require.NoError(t, deliver(b.ctx, mw, seen, []byte(`{"n":1}`)))

	ids := []string{poison}
	for range 40 {
		ids = append(ids, newID())
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(ids)+2)
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- deliver(b.ctx, mw, id, []byte(`{}`)) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); errs <- deliver(b.ctx, mw, seen, []byte(`{"n":1}`)) }() // a redelivery
	go func() { defer wg.Done(); errs <- deliver(b.ctx, mw, seen, []byte(`{"n":2}`)) }() // a conflict
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	for _, id := range ids[1:] {
		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
	}
	require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(poison))
	require.Equal(t, 0, appliedRows(t, b, consumer, poison), "the poison message's writes were rolled back to its savepoint")
	require.ElementsMatch(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Conflict}, b.events.outcomes(seen))
	require.Equal(t, 1, appliedRows(t, b, consumer, seen))

	// now() is the start of the transaction, the same for every savepoint in
	// it: applied rows that share it were committed together.
	var rows, txs int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT processed_at) FROM inbox_messages WHERE message_id = ANY($1)`, ids[1:]).Scan(&rows, &txs))
	require.Equal(t, len(ids)-1, rows)
	require.Less(t, txs, rows, "no two deliveries shared a transaction")
	t.Logf("%d good messages applied in %d transactions", rows, txs)
}

// TestHandlerBatches delivers many messages at once to a set-based Handler:
// poison messages among them, a payload conflict, a redelivery, and one id
// delivered twice at the same moment. Each good message is applied exactly
// once, batches of more than one message commit together, each poison
// message alone is retried and dead-lettered, and the companions of a poison
// message are applied alone after their batch failed.
func TestHandlerBatches(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{BatchSize: 16, BatchWorkers: 2, MaxAttempts: 2, RetryBackoff: time.Millisecond})
	var mu sync.Mutex
	var sizes []int
	failedWithCompanions := 0
	poison := map[string]bool{}
	companions := map[string]bool{} // good messages that were in a batch a poison failed
	alone := map[string]bool{}      // good messages applied by a call of their own
	apply := func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(msgs))
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			if poison[m.UUID] {
				if len(msgs) > 1 {
					failedWithCompanions++
					for _, c := range msgs {
						if !poison[c.UUID] {
							companions[c.UUID] = true
						}
					}
				}
				return errors.New("cannot apply " + m.UUID)
			}
			ids[i] = m.UUID
		}
		if len(msgs) == 1 {
			alone[msgs[0].UUID] = true
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) SELECT $1, unnest($2::text[]), 1`, in.Consumer(), ids)
		return err
	}
	h := in.Handler(apply)
	deliverTo := func(id string, payload []byte) error {
		msg := message.NewMessage(id, payload)
		msg.SetContext(b.ctx)
		return h(msg)
	}
	seen := newID()
	require.NoError(t, deliverTo(seen, []byte(`{"n":1}`)))

	twice := newID()
	var good, all []string
	for i := range 80 {
		id := newID()
		if i%20 == 10 {
			poison[id] = true
		} else {
			good = append(good, id)
		}
		all = append(all, id)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(all)+4)
	for _, id := range append(all, twice, twice) {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- deliverTo(id, []byte(`{}`)) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); errs <- deliverTo(seen, []byte(`{"n":1}`)) }() // a redelivery
	go func() { defer wg.Done(); errs <- deliverTo(seen, []byte(`{"n":2}`)) }() // a conflict
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	for _, id := range good {
		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
	}
	require.ElementsMatch(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(twice))
	require.Equal(t, 1, appliedRows(t, b, consumer, twice))
	for id := range poison {
		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE message_id = $1 AND kind = 'dead_letter'`, id))
	}
	require.ElementsMatch(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Conflict}, b.events.outcomes(seen))
	require.Equal(t, 1, appliedRows(t, b, consumer, seen))

	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, slices.Max(sizes), 1, "every call of the BatchFunc had one message")
	require.Positive(t, failedWithCompanions, "no poison message shared a batch; the fallback went untested")
	// A failed batch is split in halves, so most of a poison message's
	// companions still commit in batches: fewer end up alone than shared
	// its failed batches (falling back to singles would make them equal).
	companionsAlone := 0
	for id := range companions {
		if alone[id] {
			companionsAlone++
		}
	}
	require.Less(t, companionsAlone, len(companions), "every companion of a poison message was applied alone")
	var rows, txs int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT processed_at) FROM inbox_messages WHERE message_id = ANY($1)`, good).Scan(&rows, &txs))
	require.Equal(t, len(good), rows)
	require.Less(t, txs, rows, "no two deliveries shared a transaction")
	t.Logf("%d good messages applied in %d transactions; BatchFunc calls of sizes %v; %d of %d companions of a poison message alone",
		rows, txs, sizes, companionsAlone, len(companions))
}

// TestBatchLinger delivers like a Kafka consumer: each of eight partitions
// hands over its next message only when the last one returned. Once the
// consumer is busy, a batch waits for the deliveries its predecessor
// released, so every later batch holds a message of every partition instead
// of the two halves of them taking turns. (With BatchLinger 0 this test
// fails: the halves stay apart.)
func TestBatchLinger(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 8, 12
	// The linger is far longer than a delivery takes even under -race on a
	// busy machine; a batch waits only until the partitions are back.
	in, b := setup(t, inbox.Config{BatchSize: 64, BatchWorkers: 1, BatchLinger: 200 * time.Millisecond})
	var mu sync.Mutex
	var sizes []int
	h := in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		mu.Lock()
		sizes = append(sizes, len(msgs))
		mu.Unlock()
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.UUID
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) SELECT $1, unnest($2::text[]), 1`, in.Consumer(), ids)
		return err
	})
	var wg sync.WaitGroup
	errs := make(chan error, partitions)
	for range partitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perPartition {
				msg := message.NewMessage(newID(), []byte(`{}`))
				msg.SetContext(b.ctx)
				if err := h(msg); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, partitions*perPartition, scalar[int](t, b, `SELECT count(*) FROM applied`))

	t.Logf("batch sizes: %v", sizes)
	full := 0
	for _, n := range sizes {
		if n == partitions {
			full++
		}
	}
	// The first batches form while the partitions start at different
	// moments; from the first busy batch on, every batch is full.
	require.GreaterOrEqual(t, full, perPartition-2, "batches did not hold a message of every partition: %v", sizes)
}

// TestBatchesAcrossHandlers: deliveries of two Middleware-wrapped handlers
// of one inbox share batch transactions (a savepoint each), as deliveries of
// one handler do; and a BatchFunc finds the transaction in its context
// (TxFromContext), alone and in a batch.
func TestBatchesAcrossHandlers(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{BatchSize: 16, BatchWorkers: 1, BatchLinger: 50 * time.Millisecond})
	record := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		_, err := inbox.Tx(ctx).Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, txid_current()::int)`, msg.Metadata.Get("handler"), msg.UUID)
		return nil, err
	}
	handlers := map[string]message.HandlerFunc{"a": in.Middleware(record), "b": in.Middleware(record)}
	shared := func() bool { // one round: 8 deliveries through each handler at once
		var wg sync.WaitGroup
		for name, h := range handlers {
			for range 8 {
				wg.Go(func() {
					msg := message.NewMessage(newID(), []byte(`{}`))
					msg.Metadata.Set("handler", name)
					msg.SetContext(b.ctx)
					if _, err := h(msg); err != nil {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		return scalar[int](t, b, `SELECT count(*) FROM (SELECT n FROM applied GROUP BY n HAVING count(DISTINCT consumer) = 2) AS both_handlers`) > 0
	}
	require.Eventually(t, shared, 20*time.Second, time.Millisecond, "no transaction ever held deliveries of both handlers")

	for _, size := range []int{1, 8} {
		other := b.newInbox(t, inbox.Config{Consumer: fmt.Sprintf("ctx-%d", size), BatchSize: size, MaxAttempts: 1})
		h := other.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			if got, ok := inbox.TxFromContext(ctx); !ok || got != tx {
				return inbox.Permanent(fmt.Errorf("BatchFunc's context holds no transaction (%v) or another one", ok))
			}
			return nil
		})
		msg := message.NewMessage(newID(), []byte(`{}`))
		msg.SetContext(b.ctx)
		require.NoError(t, h(msg), "BatchSize %d", size)
		// A failing BatchFunc is retried and dead-lettered, not returned.
		require.Equal(t, inbox.Stats{Applied: 1}, other.Stats(), "BatchSize %d: the BatchFunc did not apply", size)
	}
}
