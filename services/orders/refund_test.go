package main

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// TestRefundCapture: a captured order refunded, asked twice, is refunded
// once through the provider's 500s and lost answers: one refund of the
// whole capture under refund-<order id>, the order rejected with the
// reason and its payment refunded with the provider's refund id. A refund
// of an order declined, still capturing, never paid or unknown is refused
// with its reason, and nothing is recorded for it.
func TestRefundCapture(t *testing.T) {
	t.Parallel()
	url, ledger := startProvider(t, provider.Config{FailRate: 0.3, LostResponseRate: 0.3, Seed: 5})
	pool := newDB(t)
	db := platform.DB{Pool: pool}
	var captured []string
	for range 6 {
		captured = append(captured, reserve(t, pool, defaultCard, oneLine))
	}
	declined := reserve(t, pool, "tok_declined", oneLine)
	runCaptures(t, pool, platform.Config{ProviderURL: url})
	capturing := reserve(t, pool, defaultCard, oneLine)

	for _, id := range captured {
		o, err := requestRefund(t.Context(), db, id, "inventory rejected it")
		require.NoError(t, err)
		require.Equal(t, []string{"rejected", "refunding", "refunded: inventory rejected it"}, []string{o.Status, o.Payment, o.RejectReason})
		again, err := requestRefund(t.Context(), db, id, "asked again")
		require.NoError(t, err, "a refund asked for twice is answered as it stands")
		require.Equal(t, o, again)
	}
	for id, why := range map[string]string{declined: "payment is declined", capturing: "payment is capturing", newOrder(t, pool): "payment is none"} {
		_, err := requestRefund(t.Context(), db, id, "r")
		require.ErrorAs(t, err, new(errRefundRefused))
		require.ErrorContains(t, err, why)
	}
	_, err := requestRefund(t.Context(), db, uuid.NewString(), "r")
	require.ErrorIs(t, err, errNotFound)
	require.Equal(t, len(captured), scalar[int](t, pool, `SELECT count(*) FROM effects WHERE kind = 'refund'`), "one refund effect per order")

	runCaptures(t, pool, platform.Config{ProviderURL: url})
	for _, id := range captured {
		o, err := getOrder(t.Context(), pool, id)
		require.NoError(t, err)
		require.Equal(t, "refunded", o.Payment, o.PaymentError)
		require.Equal(t, [][]any{{o.RefundID, o.CaptureID, o.Amount, events.RefundKey(id)}},
			rows(t, ledger, `SELECT id, capture_id, amount, idempotency_key FROM refunds WHERE reference = $1`, id), "refunds of %s", id)
	}
	require.Zero(t, scalar[int](t, ledger, `SELECT count(*) FROM refunds WHERE reference = $1`, declined))
}

// TestRefundReasons: the reason a refund is asked with is text a person
// reads: required, printable, at most 500 bytes.
func TestRefundReasons(t *testing.T) {
	t.Parallel()
	require.NoError(t, validReason("inventory rejected the order"))
	for _, bad := range []string{"", "a\x00b", "line\nbreak", "\xff", string(make([]byte, 501))} {
		require.Error(t, validReason(bad), "%q", bad)
	}
}
