package judge_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/services/events"
)

// ledger returns the provider's database with the bundle's two reserved
// orders captured once each, for their amounts, as orders records them.
func (b *testBundle) ledger(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ledger := pg.TestDatabase(t)
	require.NoError(t, provider.Migrate(b.ctx, ledger))
	for _, id := range []string{b.reserved, b.reserved2} {
		capID := b.capture(t, ledger, id, "captured")
		b.exec(t, b.orders, `UPDATE orders SET payment = 'captured', capture_id = $2 WHERE id = $1`, id, capID)
	}
	return ledger
}

// capture writes one attempt for order id into the ledger, for the
// order's amount, as the provider executes one.
func (b *testBundle) capture(t *testing.T, ledger *pgxpool.Pool, id, status string) string {
	t.Helper()
	var lines []events.Line
	require.NoError(t, b.orders.QueryRow(b.ctx, `SELECT lines FROM orders WHERE id = $1`, id).Scan(&lines))
	b.exec(t, b.orders, `UPDATE orders SET amount = $2 WHERE id = $1`, id, events.Amount(lines))
	capID := "cap_" + uuid.NewString()
	b.exec(t, ledger, `INSERT INTO captures (id, amount, currency, reference, source, status, idempotency_key, request_id, created_at)
		VALUES ($1, $2, 'eur', $3, 'tok_visa', $4, $5, 'req_1', now())`, capID, events.Amount(lines), id, status, "capture-"+id)
	return capID
}

// retried makes the order's first attempt in the ledger firstStatus, and
// adds the attempt a person's retry made, captured, as the order records it.
func (b *testBundle) retried(t *testing.T, ledger *pgxpool.Pool, id, firstStatus string) {
	t.Helper()
	b.exec(t, ledger, `UPDATE captures SET status = $2 WHERE reference = $1`, id, firstStatus)
	capID := b.capture(t, ledger, id, "captured")
	b.exec(t, b.orders, `UPDATE orders SET capture_attempt = 2, payment = 'captured', capture_id = $2 WHERE id = $1`, id, capID)
}

// TestPaymentsChecker: a consistent ledger passes; every way a ledger can
// disagree with the orders (twice, for nobody, for the wrong amount, for an
// order never reserved, not yet made, or with another outcome) fails, each
// with its reason.
func TestPaymentsChecker(t *testing.T) {
	b := setup(t)
	ledger := b.ledger(t)
	r, err := judge.CheckPayments(b.ctx, b.orders, ledger)
	require.NoError(t, err)
	require.True(t, r.Invariant.OK, r.Invariant.Detail)
	require.Equal(t, 2, r.Captured)
	// A person retried a declined capture: declined, then captured.
	b.retried(t, ledger, b.reserved, "declined")
	r, err = judge.CheckPayments(b.ctx, b.orders, ledger)
	require.NoError(t, err)
	require.True(t, r.Invariant.OK, r.Invariant.Detail)
	require.Zero(t, r.CapturedTwice)

	// The auditor's repair: b.reserved2's capture refunded in full, the
	// order ending rejected (orders' refund.go).
	refunded := func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
		t.Helper()
		b.exec(t, l, `INSERT INTO refunds (id, capture_id, amount, currency, reference, idempotency_key, request_id, created_at)
			SELECT 're_1', id, amount, currency, reference, 'refund-' || reference, 'req_r', now() FROM captures WHERE reference = $1 AND status = 'captured'`, b.reserved2)
		b.exec(t, b.orders, `UPDATE orders SET status = 'rejected', payment = 'refunded', refund_id = 're_1', refund_at = now() WHERE id = $1`, b.reserved2)
	}
	refunded(t, b, ledger)
	r, err = judge.CheckPayments(b.ctx, b.orders, ledger)
	require.NoError(t, err)
	require.True(t, r.Invariant.OK, r.Invariant.Detail)
	require.Equal(t, 1, r.Refunded)

	for _, tc := range []struct {
		name, want string
		breakIt    func(t *testing.T, b *testBundle, ledger *pgxpool.Pool)
	}{
		{"captured twice", "2 attempts in the ledger", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.capture(t, l, b.reserved, "captured")
		}},
		{"a capture for an order that does not exist", "an order that does not exist", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `INSERT INTO captures (id, amount, currency, reference, source, status, request_id, created_at)
				VALUES ('cap_phantom', 100, 'eur', $1, 'tok_visa', 'captured', 'req_2', now())`, uuid.NewString())
		}},
		{"the wrong amount", "the ledger holds", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `UPDATE captures SET amount = amount + 1 WHERE reference = $1`, b.reserved)
		}},
		{"the order's amount off its lines", "its lines cost", func(t *testing.T, b *testBundle, _ *pgxpool.Pool) {
			b.exec(t, b.orders, `UPDATE orders SET amount = amount * 2 WHERE id = $1`, b.reserved)
		}},
		{"a rejected order captured", "only a reserved order is captured", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.capture(t, l, b.rejected, "captured")
		}},
		{"a capture never made", "still pending", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `DELETE FROM captures WHERE reference = $1`, b.reserved2)
			b.exec(t, b.orders, `UPDATE orders SET payment = 'capturing', capture_id = NULL WHERE id = $1`, b.reserved2)
		}},
		{"a capture made, the order not told", "0 attempts", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `DELETE FROM captures WHERE reference = $1`, b.reserved2)
		}},
		{"declined in the ledger, captured in the order", "the ledger says declined", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `UPDATE captures SET status = 'declined' WHERE reference = $1`, b.reserved)
		}},
		{"another currency", "the ledger holds", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `UPDATE captures SET currency = 'usd' WHERE reference = $1`, b.reserved)
		}},
		{"another card charged", "the ledger charged card tok_mastercard", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `UPDATE captures SET source = 'tok_mastercard' WHERE reference = $1`, b.reserved)
		}},
		{"the order names another capture", "the order records capture", func(t *testing.T, b *testBundle, _ *pgxpool.Pool) {
			b.exec(t, b.orders, `UPDATE orders SET capture_id = 'cap_other' WHERE id = $1`, b.reserved)
		}},
		{"a retry captured after a capture", "captured 2 times", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.retried(t, l, b.reserved, "captured")
		}},
		{"more attempts than asked for", "3 attempts in the ledger after 2 captures asked for", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.retried(t, l, b.reserved, "declined")
			b.capture(t, l, b.reserved, "declined")
		}},
		{"refunded twice", "2 refunds in the ledger", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			refunded(t, b, l)
			b.exec(t, l, `INSERT INTO refunds (id, capture_id, amount, currency, reference, request_id, created_at)
				SELECT 're_2', capture_id, amount, currency, reference, 'req_r2', now() FROM refunds WHERE id = 're_1'`)
		}},
		{"refunded in part", "the ledger refunded", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			refunded(t, b, l)
			b.exec(t, l, `UPDATE refunds SET amount = amount - 1 WHERE id = 're_1'`)
		}},
		{"refunded, the order not told", "refunds in the ledger for an order whose payment is \"captured\"", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			refunded(t, b, l)
			b.exec(t, b.orders, `UPDATE orders SET status = 'reserved', payment = 'captured', refund_id = NULL WHERE id = $1`, b.reserved2)
		}},
		{"the order says refunded, nothing refunded", "0 refunds in the ledger", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			refunded(t, b, l)
			b.exec(t, l, `DELETE FROM refunds`)
		}},
		{"the order names another refund", "the order records refund", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			refunded(t, b, l)
			b.exec(t, b.orders, `UPDATE orders SET refund_id = 're_other' WHERE id = $1`, b.reserved2)
		}},
		{"a refund still pending", "still pending", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, b.orders, `UPDATE orders SET status = 'rejected', payment = 'refunding', refund_at = now() WHERE id = $1`, b.reserved2)
		}},
		{"a good card declined", "card tok_visa was declined", func(t *testing.T, b *testBundle, l *pgxpool.Pool) {
			b.exec(t, l, `UPDATE captures SET status = 'declined' WHERE reference = $1`, b.reserved)
			b.exec(t, b.orders, `UPDATE orders SET payment = 'declined' WHERE id = $1`, b.reserved)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			ledger := b.ledger(t)
			tc.breakIt(t, b, ledger)
			r, err := judge.CheckPayments(b.ctx, b.orders, ledger)
			require.NoError(t, err)
			require.False(t, r.Invariant.OK, "the checker passed %s: %s", tc.name, r.Invariant.Detail)
			require.Contains(t, r.Invariant.Detail, tc.want)
		})
	}
}
