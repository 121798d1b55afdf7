package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestMiddlewareDedupeScope: deduplication is per consumer. (Without it, in
// a failpoint build's control run, every delivery applies: control_test.go.)
func TestMiddlewareDedupeScope(t *testing.T) {
	t.Parallel()

	t.Run("DedupeIsPerConsumer", func(t *testing.T) {
		t.Parallel()
		billing, b := setup(t, inbox.Config{Consumer: "billing"})
		shipping := b.newInbox(t, inbox.Config{Consumer: "shipping"})
		shippingHandler := &applier{consumer: "shipping"}
		id, payload := newID(), []byte(`{"order":1}`)

		for range 2 {
			require.NoError(t, deliver(b.ctx, billing.Middleware(b.handler.handle), id, payload))
			require.NoError(t, deliver(b.ctx, shipping.Middleware(shippingHandler.handle), id, payload))
		}

		require.Equal(t, 1, appliedRows(t, b, "billing", id))
		require.Equal(t, 1, appliedRows(t, b, "shipping", id))
		require.Equal(t, inbox.Stats{Applied: 1, Duplicates: 1}, billing.Stats())
		require.Equal(t, inbox.Stats{Applied: 1, Duplicates: 1}, shipping.Stats())
		require.Equal(t, 2, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, id))
	})

}

// TestDuplicatesCounterSaturates: a message id delivered again and again (a
// producer stuck re-sending one record, or one writing it on purpose) counts
// its copies on its inbox row. The count is an int: past 2^31 - 1 the UPDATE
// failed with "integer out of range", the delivery returned an error, and the
// copy came back forever, blocking its partition. The count now stops at its
// maximum and every copy is still suppressed.
func TestDuplicatesCounterSaturates(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 4} {
		in, b := setup(t, inbox.Config{BatchSize: batch})
		mw := in.Middleware(b.handler.handle)
		id, payload := newID(), []byte(`{"amount":100}`)
		require.NoError(t, deliver(b.ctx, mw, id, payload))
		_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET duplicates = 2147483646 WHERE message_id = $1`, id)
		require.NoError(t, err)

		for range 3 {
			require.NoError(t, deliver(b.ctx, mw, id, payload), "batch size %d", batch)
		}
		require.Equal(t, 2147483647, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate, inbox.Duplicate, inbox.Duplicate}, b.events.outcomes(id))
	}
}
