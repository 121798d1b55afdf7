package inbox_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// TestAcknowledgesOnceTheStandbyHolds: with Config.Standby, a delivery
// returns (and the broker's offset may move) only once a streaming standby
// flushed the transaction that settled it, however it settled: applied,
// seen before, dead-lettered, quarantined as invalid, in a batch.
func TestAcknowledgesOnceTheStandbyHolds(t *testing.T) {
	t.Parallel()
	type held struct {
		gate *standby.Gate
		node *pgtest.Standby
	}
	start := func(t *testing.T, cfg inbox.Config) (message.HandlerFunc, *testBundle, held) {
		_, b := setup(t, inbox.Config{})
		h := held{node: pg.StartStandby(t, b.pool)}
		var err error
		h.gate, err = standby.New(standby.Config{Pool: b.pool, Slots: []string{h.node.Slot}})
		require.NoError(t, err)
		cfg.Standby = h.gate
		in := b.newInbox(t, cfg)
		return in.Middleware(b.handler.handle), b, h
	}
	// deliverHeld delivers id, checks that the delivery does not return
	// while the standby lags (over 20 of the gate's reads), then lets the
	// standby catch up and returns what the delivery returned.
	deliverHeld := func(t *testing.T, b *testBundle, h held, mw message.HandlerFunc, id string) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- deliver(b.ctx, mw, id, []byte(`{"amount":100}`)) }()
		for h.gate.Stats().Waiting == 0 {
			select {
			case err := <-done:
				t.Fatalf("the delivery returned (%v) without waiting for the standby", err)
			default:
			}
		}
		for reads := h.gate.Stats().Reads; h.gate.Stats().Reads < reads+20; {
			select {
			case err := <-done:
				t.Fatalf("the delivery returned (%v) before the standby held its transaction", err)
			default:
			}
		}
		h.node.CatchUp()
		return <-done
	}

	t.Run("Applied", func(t *testing.T) {
		t.Parallel()
		mw, b, h := start(t, inbox.Config{})
		id := newID()
		require.NoError(t, deliverHeld(t, b, h, mw, id))
		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(id))
		t.Run("SeenBefore", func(t *testing.T) {
			require.NoError(t, deliverHeld(t, b, h, mw, id))
			require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id))
		})
	})
	t.Run("DeadLettered", func(t *testing.T) {
		t.Parallel()
		mw, b, h := start(t, inbox.Config{MaxAttempts: 1})
		b.handler.hook = func(*message.Message, int) error { return errors.New("ledger unavailable") }
		id := newID()
		require.NoError(t, deliverHeld(t, b, h, mw, id))
		require.Contains(t, b.events.outcomes(id), inbox.DeadLettered)
	})
	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		mw, b, h := start(t, inbox.Config{})
		require.NoError(t, deliverHeld(t, b, h, mw, ""))
		require.Equal(t, inbox.Invalid, b.events.last(t).Outcome)
	})
	t.Run("Batched", func(t *testing.T) {
		t.Parallel()
		mw, b, h := start(t, inbox.Config{BatchSize: 4})
		id := newID()
		require.NoError(t, deliverHeld(t, b, h, mw, id))
		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(id))
	})
}
