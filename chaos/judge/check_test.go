package judge_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// every invariant Run reports.
var allInvariants = []string{judge.ExactlyOnce, judge.EffectsHaveCauses, judge.Quantities, judge.StockConsistent, judge.ClientAgrees, judge.NothingLost}

// testBundle holds two databases built as the services build theirs (the
// outbox's, the inbox's and the service's own migrations) and the ids of a
// small run seeded into them, which passes every invariant:
//
//	reserved   lines sku-a×1, sku-b×1, sku-a×2 (two lines of one SKU: reserved as 3),
//	           captured, and ended by inventory (its units sold)
//	rejected   sku-c×2, more than the 1 in stock
//	reserved2  sku-b×2
//	unpaid     sku-a×1, created and never paid; the client knows it
//	stranger   sku-a×1, created and never paid; a create whose response the client lost
type testBundle struct {
	ctx               context.Context
	orders, inventory *pgxpool.Pool
	seeded            map[string]int
	client            *judge.Client

	reserved, rejected, reserved2, unpaid, stranger string // order ids
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b := &testBundle{ctx: ctx, seeded: map[string]int{"sku-a": 10, "sku-b": 5, "sku-c": 1}}
	b.orders = serviceDatabase(t, ctx, "orders")
	b.inventory = serviceDatabase(t, ctx, "inventory")
	for sku, n := range b.seeded {
		b.exec(t, b.inventory, `INSERT INTO stock (sku, available) VALUES ($1, $2)`, sku, n)
	}

	b.reserved = b.createOrder(t, events.Line{SKU: "sku-a", Quantity: 1}, events.Line{SKU: "sku-b", Quantity: 1}, events.Line{SKU: "sku-a", Quantity: 2})
	b.pay(t, b.reserved)
	b.reserve(t, b.reserved, map[string]int{"sku-a": 3, "sku-b": 1})
	b.settle(t, b.reserved, "reserved")
	b.captured(t, b.reserved)
	b.end(t, b.reserved, map[string]int{"sku-a": 3, "sku-b": 1})

	b.rejected = b.createOrder(t, events.Line{SKU: "sku-c", Quantity: 2})
	b.pay(t, b.rejected)
	b.reject(t, b.rejected)
	b.settle(t, b.rejected, "rejected")

	b.reserved2 = b.createOrder(t, events.Line{SKU: "sku-b", Quantity: 2})
	b.pay(t, b.reserved2)
	b.reserve(t, b.reserved2, map[string]int{"sku-b": 2})
	b.settle(t, b.reserved2, "reserved")

	b.unpaid = b.createOrder(t, events.Line{SKU: "sku-a", Quantity: 1})
	b.stranger = b.createOrder(t, events.Line{SKU: "sku-a", Quantity: 1})

	b.client = &judge.Client{Paid: []string{b.reserved, b.rejected, b.reserved2}, Unpaid: []string{b.unpaid}}
	return b
}

// serviceDatabase creates an empty database and migrates it as service
// does at start (services/internal/platform): the outbox, the inbox, then
// the service's own files, read from the directory the service embeds.
func serviceDatabase(t *testing.T, ctx context.Context, service string) *pgxpool.Pool {
	t.Helper()
	pool := pg.TestDatabase(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, inbox.Migrate(ctx, pool))
	require.NoError(t, effect.Migrate(ctx, pool)) // orders' captures
	require.NoError(t, migrate.Apply(ctx, pool, service, os.DirFS("../../services/"+service+"/migrations")))
	return pool
}

func (b *testBundle) exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(b.ctx, sql, args...)
	require.NoError(t, err, sql)
}

// createOrder writes an order as POST /orders does.
func (b *testBundle) createOrder(t *testing.T, lines ...events.Line) string {
	t.Helper()
	id := uuid.Must(uuid.NewV7()).String()
	b.exec(t, b.orders, `INSERT INTO orders (id, lines) VALUES ($1, $2)`, id, lines)
	return id
}

// pay writes a payment as POST /orders/{id}/pay does, with its OrderPaid
// in the outbox, published.
func (b *testBundle) pay(t *testing.T, id string) {
	t.Helper()
	b.exec(t, b.orders, `UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1`, id)
	b.publishOrderPaid(t, id)
}

func (b *testBundle) publishOrderPaid(t *testing.T, id string) {
	t.Helper()
	payload, err := events.Encode(events.OrderPaid{Envelope: events.NewEnvelope(events.TypeOrderPaid, id), PaidAt: time.Now()})
	require.NoError(t, err)
	b.exec(t, b.orders, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload, published_at) VALUES ($1, $2, $3, $4, now())`,
		uuid.NewString(), events.TopicOrders, id, payload)
}

// reserve writes a reservation as inventory's handler does: the decision,
// one row per SKU, the stock taken, the answer published.
func (b *testBundle) reserve(t *testing.T, id string, quantities map[string]int) {
	t.Helper()
	b.exec(t, b.inventory, `INSERT INTO decisions (order_id, decision, message_id) VALUES ($1, 'reserved', $2)`, id, uuid.NewString())
	b.reserveRows(t, id, quantities)
	b.publishAnswer(t, id)
}

// reserveRows writes reservation rows and takes their stock, as an
// unguarded inventory (no decision) would.
func (b *testBundle) reserveRows(t *testing.T, id string, quantities map[string]int) {
	t.Helper()
	for sku, n := range quantities {
		b.exec(t, b.inventory, `INSERT INTO reservations (order_id, sku, quantity, message_id) VALUES ($1, $2, $3, $4)`, id, sku, n, uuid.NewString())
		b.exec(t, b.inventory, `UPDATE stock SET available = available - $2, reserved = reserved + $2 WHERE sku = $1`, sku, n)
	}
}

// captured records a captured payment as the capture runner does, with its
// OrderCaptured in the outbox, published.
func (b *testBundle) captured(t *testing.T, id string) {
	t.Helper()
	b.exec(t, b.orders, `UPDATE orders SET payment = 'captured', capture_id = 'cap_1', payment_at = now() WHERE id = $1`, id)
	b.publishOrderCaptured(t, id, "cap_1")
}

// publishOrderCaptured puts an OrderCaptured for order id in the orders
// outbox, published.
func (b *testBundle) publishOrderCaptured(t *testing.T, id, captureID string) {
	t.Helper()
	payload, err := events.Encode(events.OrderCaptured{Envelope: events.NewEnvelope(events.TypeOrderCaptured, id), CaptureID: captureID})
	require.NoError(t, err)
	b.exec(t, b.orders, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload, published_at) VALUES ($1, $2, $3, $4, now())`,
		uuid.NewString(), events.TopicOrders, id, payload)
}

// end applies OrderCaptured as inventory's handler does: the order ended
// in its decision, and its units sold.
func (b *testBundle) end(t *testing.T, id string, quantities map[string]int) {
	t.Helper()
	msg := uuid.NewString()
	b.exec(t, b.inventory, `UPDATE decisions SET fulfilled_by = $2, fulfilled_at = now() WHERE order_id = $1`, id, msg)
	b.endRows(t, id, quantities)
}

// endRows writes fulfilment rows and sells their reserved units, as an
// unguarded inventory would.
func (b *testBundle) endRows(t *testing.T, id string, quantities map[string]int) {
	t.Helper()
	msg := uuid.NewString()
	for sku, n := range quantities {
		b.exec(t, b.inventory, `INSERT INTO fulfilments (order_id, sku, quantity, message_id) VALUES ($1, $2, $3, $4)`, id, sku, n, msg)
		b.exec(t, b.inventory, `UPDATE stock SET reserved = reserved - $2, sold = sold + $2 WHERE sku = $1`, sku, n)
	}
}

// reject writes a rejection as inventory's handler does.
func (b *testBundle) reject(t *testing.T, id string) {
	t.Helper()
	msg := uuid.NewString()
	b.exec(t, b.inventory, `INSERT INTO decisions (order_id, decision, message_id) VALUES ($1, 'rejected', $2)`, id, msg)
	b.exec(t, b.inventory, `INSERT INTO rejections (order_id, reason, message_id) VALUES ($1, 'insufficient stock', $2)`, id, msg)
	b.publishAnswer(t, id)
}

func (b *testBundle) publishAnswer(t *testing.T, id string) {
	t.Helper()
	b.exec(t, b.inventory, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload, published_at) VALUES ($1, $2, $3, '{}', now())`,
		uuid.NewString(), events.TopicInventory, id)
}

// settle applies inventory's answer in orders as the settler does.
func (b *testBundle) settle(t *testing.T, id, status string) {
	t.Helper()
	event := events.TypeInventoryReserved
	if status == "rejected" {
		event = events.TypeInventoryRejected
	}
	b.exec(t, b.orders, `UPDATE orders SET status = $2, settled_at = now() WHERE id = $1`, id, status)
	b.exec(t, b.orders, `INSERT INTO order_events (order_id, event, message_id) VALUES ($1, $2, $3)`, id, event, uuid.NewString())
}

func (b *testBundle) check(t *testing.T) judge.Report {
	t.Helper()
	report, err := judge.Run(b.ctx, b.orders, b.inventory, b.seeded, b.client)
	require.NoError(t, err)
	return report
}

func TestConsistentRunPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	report := b.check(t)

	for _, name := range allInvariants {
		inv, ok := report.Invariant(name)
		require.True(t, ok, "no invariant %s", name)
		require.True(t, inv.OK, "%s: %s", name, inv.Detail)
	}
	require.Equal(t, 3, report.OrdersPaid)
	require.Equal(t, 2, report.Reserved)
	require.Equal(t, 1, report.Rejected)
	require.Equal(t, 2, report.ReservationsMade)
	require.Equal(t, 1, report.Ended)
	require.Zero(t, report.DoubleApplied)
	require.Zero(t, report.NotEnded)
	clientAgrees, _ := report.Invariant(judge.ClientAgrees)
	require.Contains(t, clientAgrees.Detail, "1 unpaid orders it never heard of")
}

// TestAdversarialRunsFail tampers with the consistent run, one way per case,
// and requires the invariant that owns that kind of defect to fail (and the
// ones listed beside it), every other invariant to hold, and the detail to
// name the order.
func TestAdversarialRunsFail(t *testing.T) {
	t.Parallel()
	newID := func() string { return uuid.Must(uuid.NewV7()).String() }
	cases := []struct {
		name      string
		tamper    func(t *testing.T, b *testBundle) (subject string) // returns what the detail must quote
		fails     string
		alsoFails []string // invariants that must fail with it
	}{
		{
			name: "phantom reservation for an unpaid order",
			tamper: func(t *testing.T, b *testBundle) string {
				b.reserve(t, b.unpaid, map[string]int{"sku-a": 1})
				return b.unpaid
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "reservation for an order that does not exist",
			tamper: func(t *testing.T, b *testBundle) string {
				id := newID()
				b.reserveRows(t, id, map[string]int{"sku-a": 1}) // no decision: as an unguarded inventory writes
				return id
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "rejection for an unpaid order",
			tamper: func(t *testing.T, b *testBundle) string {
				b.reject(t, b.unpaid)
				return b.unpaid
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "OrderPaid in the outbox for an unpaid order",
			tamper: func(t *testing.T, b *testBundle) string {
				b.publishOrderPaid(t, b.unpaid)
				return b.unpaid
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "answer applied in orders that contradicts inventory's decision",
			tamper: func(t *testing.T, b *testBundle) string {
				// inventory rejected it; orders settles it reserved.
				b.exec(t, b.orders, `UPDATE orders SET status = 'reserved' WHERE id = $1`, b.rejected)
				b.exec(t, b.orders, `UPDATE order_events SET event = $2 WHERE order_id = $1`, b.rejected, events.TypeInventoryReserved)
				return b.rejected
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "answer applied in orders with no decision in inventory",
			tamper: func(t *testing.T, b *testBundle) string {
				id := b.createOrder(t, events.Line{SKU: "sku-a", Quantity: 1})
				b.pay(t, id)
				b.settle(t, id, "reserved")
				b.client.Paid = append(b.client.Paid, id)
				return id
			},
			fails: judge.EffectsHaveCauses,
			// Inventory never applied the order, so it also counts as lost.
			alsoFails: []string{judge.NothingLost},
		},
		{
			name: "reservation quantity other than the order's lines",
			tamper: func(t *testing.T, b *testBundle) string {
				// One row, as one application writes, with one unit more,
				// and the stock kept in balance with it: only the
				// comparison with the order's lines can see it.
				b.exec(t, b.inventory, `UPDATE reservations SET quantity = quantity + 1 WHERE order_id = $1`, b.reserved2)
				b.exec(t, b.inventory, `UPDATE stock SET available = available - 1, reserved = reserved + 1 WHERE sku = 'sku-b'`)
				return b.reserved2
			},
			fails: judge.Quantities,
		},
		{
			name: "reservation of the lines' first quantity, not their sum",
			tamper: func(t *testing.T, b *testBundle) string {
				// reserved has sku-a on two lines (1 and 2): reserving 1
				// is wrong, however consistent the stock.
				// (It ended, so its sale is of 1 too.)
				b.exec(t, b.inventory, `UPDATE reservations SET quantity = 1 WHERE order_id = $1 AND sku = 'sku-a'`, b.reserved)
				b.exec(t, b.inventory, `UPDATE fulfilments SET quantity = 1 WHERE order_id = $1 AND sku = 'sku-a'`, b.reserved)
				b.exec(t, b.inventory, `UPDATE stock SET available = available + 2, sold = sold - 2 WHERE sku = 'sku-a'`)
				return b.reserved
			},
			fails: judge.Quantities,
		},
		{
			name: "stock out of balance with the reservations",
			tamper: func(t *testing.T, b *testBundle) string {
				b.exec(t, b.inventory, `UPDATE stock SET available = available + 1 WHERE sku = 'sku-a'`)
				return "sku-a"
			},
			fails: judge.StockConsistent,
		},
		{
			name: "an order's units sold twice",
			tamper: func(t *testing.T, b *testBundle) string {
				// A redelivered OrderCaptured applied again: sold grows by
				// the order's sku-b again, from reserved2's units.
				b.endRows(t, b.reserved, map[string]int{"sku-b": 1})
				return b.reserved
			},
			fails: judge.ExactlyOnce,
			// The second sale's sku-b row has no sku-a beside it.
			alsoFails: []string{judge.Quantities},
		},
		{
			name: "a second OrderCaptured in the orders outbox",
			tamper: func(t *testing.T, b *testBundle) string {
				// A stale capture attempt published its end again; inventory
				// refuses it, and only the outbox shows it.
				b.publishOrderCaptured(t, b.reserved, "cap_2")
				return b.reserved
			},
			fails: judge.ExactlyOnce,
		},
		{
			name: "OrderCaptured in the outbox for an order whose payment was not captured",
			tamper: func(t *testing.T, b *testBundle) string {
				b.publishOrderCaptured(t, b.reserved2, "cap_x")
				return b.reserved2
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "units sold for an order whose payment was never captured",
			tamper: func(t *testing.T, b *testBundle) string {
				b.end(t, b.reserved2, map[string]int{"sku-b": 2})
				return b.reserved2
			},
			fails: judge.EffectsHaveCauses,
		},
		{
			name: "units sold for a rejected order",
			tamper: func(t *testing.T, b *testBundle) string {
				b.exec(t, b.orders, `UPDATE orders SET payment = 'captured' WHERE id = $1`, b.rejected)
				b.exec(t, b.inventory, `UPDATE stock SET reserved = reserved + 2 WHERE sku = 'sku-c'`)
				b.endRows(t, b.rejected, map[string]int{"sku-c": 2})
				return b.rejected
			},
			fails: judge.EffectsHaveCauses,
			// reserved went up to sell it: no reservation explains it.
			alsoFails: []string{judge.StockConsistent},
		},
		{
			name: "a captured order inventory never ended",
			tamper: func(t *testing.T, b *testBundle) string {
				b.captured(t, b.reserved2)
				return "1 captured and not ended"
			},
			fails: judge.NothingLost,
		},
		{
			name: "sale of other than the order's lines",
			tamper: func(t *testing.T, b *testBundle) string {
				// One unit of sku-a less sold, the stock kept in balance
				// with the rows.
				b.exec(t, b.inventory, `UPDATE fulfilments SET quantity = quantity - 1 WHERE order_id = $1 AND sku = 'sku-a'`, b.reserved)
				b.exec(t, b.inventory, `UPDATE stock SET reserved = reserved + 1, sold = sold - 1 WHERE sku = 'sku-a'`)
				return b.reserved
			},
			fails: judge.Quantities,
		},
		{
			name: "reserved units not released when their order ended",
			tamper: func(t *testing.T, b *testBundle) string {
				b.exec(t, b.inventory, `UPDATE stock SET reserved = reserved + 3 WHERE sku = 'sku-a'`)
				return "sku-a"
			},
			fails: judge.StockConsistent,
		},
		{
			name: "order paid in the database that the client never paid",
			tamper: func(t *testing.T, b *testBundle) string {
				// A consistent story from payment to settlement, for an
				// order whose id the client never held.
				b.pay(t, b.stranger)
				b.reserve(t, b.stranger, map[string]int{"sku-a": 1})
				b.settle(t, b.stranger, "reserved")
				return b.stranger
			},
			fails: judge.ClientAgrees,
		},
		{
			name: "order the client left unpaid, paid in the database",
			tamper: func(t *testing.T, b *testBundle) string {
				b.pay(t, b.unpaid)
				b.reserve(t, b.unpaid, map[string]int{"sku-a": 1})
				b.settle(t, b.unpaid, "reserved")
				return b.unpaid
			},
			fails: judge.ClientAgrees,
		},
		{
			name: "order the client paid, missing from the database",
			tamper: func(t *testing.T, b *testBundle) string {
				id := newID()
				b.client.Paid = append(b.client.Paid, id)
				return id
			},
			fails: judge.ClientAgrees,
		},
		{
			name: "order the client paid, still created in the database",
			tamper: func(t *testing.T, b *testBundle) string {
				b.client.Paid, b.client.Unpaid = append(b.client.Paid, b.unpaid), nil
				return b.unpaid
			},
			fails: judge.ClientAgrees,
		},
		{
			name: "one payment lost and another invented: the counts agree",
			tamper: func(t *testing.T, b *testBundle) string {
				// The client paid reserved2; the database lost it and paid
				// the stranger instead, consistently. Three paid on either
				// side: only ids tell them apart.
				b.exec(t, b.orders, `DELETE FROM order_events WHERE order_id = $1`, b.reserved2)
				b.exec(t, b.orders, `DELETE FROM outbox_messages WHERE partition_key = $1`, b.reserved2)
				b.exec(t, b.orders, `DELETE FROM orders WHERE id = $1`, b.reserved2)
				b.exec(t, b.inventory, `UPDATE stock SET available = available + 2, reserved = reserved - 2 WHERE sku = 'sku-b'`)
				b.exec(t, b.inventory, `DELETE FROM reservations WHERE order_id = $1`, b.reserved2)
				b.exec(t, b.inventory, `DELETE FROM decisions WHERE order_id = $1`, b.reserved2)
				b.exec(t, b.inventory, `DELETE FROM outbox_messages WHERE partition_key = $1`, b.reserved2)
				b.pay(t, b.stranger)
				b.reserve(t, b.stranger, map[string]int{"sku-a": 1})
				b.settle(t, b.stranger, "reserved")
				return b.reserved2
			},
			fails: judge.ClientAgrees,
		},
		{
			name: "order of unknown payment outcome, missing from the database",
			tamper: func(t *testing.T, b *testBundle) string {
				id := newID()
				b.client.Unknown = append(b.client.Unknown, id)
				return id
			},
			fails: judge.ClientAgrees,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			subject := tc.tamper(t, b)
			report := b.check(t)

			require.False(t, report.OK(), "the checker passed this run (%s): %+v", tc.name, report.Invariants)
			for _, name := range allInvariants {
				inv, ok := report.Invariant(name)
				require.True(t, ok, "no invariant %s", name)
				mustFail := name == tc.fails || slices.Contains(tc.alsoFails, name)
				require.Equal(t, !mustFail, inv.OK, "%s: %s", name, inv.Detail)
			}
			failed, _ := report.Invariant(tc.fails)
			require.Contains(t, failed.Detail, subject)
			t.Logf("%s: %s", failed.Name, failed.Detail)
		})
	}
}

// TestClientUnknownOutcomes: a payment whose answer never came may have
// committed or not, and either passes; without a client view the
// comparison is skipped, and says so.
func TestClientUnknownOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// rejected was paid, unpaid was not: the client could tell neither.
	b.client = &judge.Client{Paid: []string{b.reserved, b.reserved2}, Unknown: []string{b.rejected, b.unpaid}}
	report := b.check(t)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	inv, _ := report.Invariant(judge.ClientAgrees)
	require.Contains(t, inv.Detail, "3 paid orders, by id the 2 the client saw paid and 1 of its 2 payments of unknown outcome")

	b.client = nil
	report = b.check(t)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	inv, _ = report.Invariant(judge.ClientAgrees)
	require.Contains(t, inv.Detail, "skipped")
}
