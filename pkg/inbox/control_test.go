//go:build failpoint

package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestWithoutDedupe: the control runs, in a failpoint build only. Without
// the inbox row the same deliveries are applied more than once: the
// dedupe tests (dedupe_test.go) can fail.
func TestWithoutDedupe(t *testing.T) {
	t.Parallel()
	t.Run("ConcurrentDeliveriesEachApply", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.WithoutDedupe(inbox.Config{}))
		b.handler.hook = holdUntilContended(t, b, 9)
		id := newID()

		deliverConcurrently(t, b.ctx, in.Middleware(b.handler.handle), id, []byte(`{"amount":100}`), 10)

		require.Equal(t, 10, appliedRows(t, b, consumer, id))
		require.Equal(t, int64(10), in.Stats().Applied)
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("RedeliveryAppliesTwice", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.WithoutDedupe(inbox.Config{}))
		mw := in.Middleware(b.handler.handle)
		id, payload := newID(), []byte(`{"amount":100}`)

		require.NoError(t, deliver(b.ctx, mw, id, payload))
		require.NoError(t, deliver(b.ctx, mw, id, payload))

		require.Equal(t, 2, appliedRows(t, b, consumer, id))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Applied}, b.events.outcomes(id))
	})
}
