package inbox_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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
