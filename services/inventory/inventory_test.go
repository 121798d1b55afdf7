package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// newDB returns a pool on a fresh database with the inventory's schema and
// the outbox, stocked with stock.
func newDB(t *testing.T, stock map[string]int) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	pool := pg.TestDatabase(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	svc := Service()
	require.NoError(t, migrate.Apply(ctx, pool, svc.Name, svc.Migrations))
	for sku, n := range stock {
		_, err := pool.Exec(ctx, `INSERT INTO stock (sku, available) VALUES ($1, $2)`, sku, n)
		require.NoError(t, err)
	}
	return pool
}

// apply runs reserveOrders on msgs in one transaction.
func apply(t *testing.T, pool *pgxpool.Pool, msgs []*message.Message) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return reserveOrders(t.Context(), tx, msgs)
	}))
}

// TestBatchDecidesAsOneByOne applies the same paid orders, over scarce stock
// and with unknown SKUs among them, once as one batch and once one message
// per transaction: the stock, the reservations, the rejections and the
// events announced must come out the same.
func TestBatchDecidesAsOneByOne(t *testing.T) {
	t.Parallel()
	stock := map[string]int{"a": 25, "b": 12, "c": 40, "d": 2}
	skus := []string{"a", "b", "c", "d", "unknown"}
	rng := rand.New(rand.NewPCG(1, 2))
	var msgs []*message.Message
	for range 60 {
		var lines []events.Line
		for range 1 + rng.IntN(3) {
			lines = append(lines, events.Line{SKU: skus[rng.IntN(len(skus))], Quantity: 1 + rng.IntN(3)})
		}
		id := uuid.NewString()
		msgs = append(msgs, orderPaid(t, id, lines...))
	}

	batched, single := newDB(t, stock), newDB(t, stock)
	apply(t, batched, msgs)
	for _, msg := range msgs {
		apply(t, single, []*message.Message{msg})
	}

	queries := []string{
		`SELECT sku, available, reserved FROM stock ORDER BY sku`,
		`SELECT order_id, sku, quantity, message_id FROM reservations ORDER BY order_id, sku`,
		`SELECT order_id, reason, message_id FROM rejections ORDER BY order_id`,
		`SELECT topic, partition_key, payload::text FROM outbox_messages ORDER BY partition_key`,
	}
	for _, q := range queries {
		want, got := rowsOf(t, single, q), rowsOf(t, batched, q)
		require.NotEmpty(t, want, q)
		require.Equal(t, want, got, q)
	}
	reserved, rejected := len(rowsOf(t, single, `SELECT DISTINCT order_id FROM reservations`)), len(rowsOf(t, single, `SELECT order_id FROM rejections`))
	require.Positive(t, reserved)
	require.Positive(t, rejected, "the stock was never short: the test decides nothing")
	require.Equal(t, len(msgs), reserved+rejected)
	t.Logf("%d orders: %d reserved, %d rejected, the same in one batch as one by one", len(msgs), reserved, rejected)
}

// orderPaid is an OrderPaid for orderID under a fresh message id.
func orderPaid(t *testing.T, orderID string, lines ...events.Line) *message.Message {
	t.Helper()
	payload, err := events.Encode(events.OrderPaid{Envelope: events.NewEnvelope(events.TypeOrderPaid, orderID), Lines: lines, PaidAt: time.Now().UTC()})
	require.NoError(t, err)
	return message.NewMessage(uuid.NewString(), payload)
}

// TestGuardDecidesEachOrderOnce sends a second OrderPaid for decided orders
// under fresh message ids (the inbox's blind spot), in a later transaction
// and within one batch: the guard refuses each with its reason, and stock and
// reservations stay as the first decision left them. Unguarded (the second
// control run), the same events reserve twice.
func TestGuardDecidesEachOrderOnce(t *testing.T) {
	t.Parallel()
	reserved, rejected, inBatch := uuid.NewString(), uuid.NewString(), uuid.NewString()
	line := events.Line{SKU: "a", Quantity: 3}
	pool := newDB(t, map[string]int{"a": 10})
	apply(t, pool, []*message.Message{orderPaid(t, reserved, line), orderPaid(t, rejected, events.Line{SKU: "a", Quantity: 9})})
	apply(t, pool, []*message.Message{orderPaid(t, reserved, line), orderPaid(t, rejected, line),
		orderPaid(t, inBatch, line), orderPaid(t, inBatch, line)})

	require.Equal(t, [][]any{{"a", int32(4), int64(6)}}, rowsOf(t, pool, `SELECT sku, available, reserved FROM stock`))
	require.Equal(t, [][]any{{reserved, int64(1)}, {inBatch, int64(1)}}, rowsOf(t, pool, `SELECT order_id, count(*) FROM reservations GROUP BY 1 ORDER BY min(id)`))
	require.Equal(t, [][]any{{rejected, int64(1)}}, rowsOf(t, pool, `SELECT order_id, count(*) FROM rejections GROUP BY 1`))
	refused := rowsOf(t, pool, `SELECT order_id, reason FROM refusals ORDER BY id`)
	require.Len(t, refused, 3)
	for i, want := range []string{reserved, rejected, inBatch} {
		require.Equal(t, want, refused[i][0])
		require.Contains(t, refused[i][1], "order already decided")
	}
	require.Equal(t, 3, len(rowsOf(t, pool, `SELECT 1 FROM outbox_messages`)), "one announcement per order")

	unguarded := newDB(t, map[string]int{"a": 10})
	for range 2 {
		require.NoError(t, pgx.BeginFunc(t.Context(), unguarded, func(tx pgx.Tx) error {
			return reserver{unguarded: true}.apply(t.Context(), tx, []*message.Message{orderPaid(t, reserved, line)})
		}))
	}
	require.Equal(t, [][]any{{"a", int32(4), int64(6)}}, rowsOf(t, unguarded, `SELECT sku, available, reserved FROM stock`), "unguarded: reserved twice")
}

func rowsOf(t *testing.T, pool *pgxpool.Pool, q string) [][]any {
	t.Helper()
	rows, err := pool.Query(t.Context(), q)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	require.NoError(t, err)
	return out
}

// TestReservedOutlivesInt32 drives a SKU's reserved units past 2^31 - 1, the
// range of the int column they were first kept in: reserved only grows
// (restocks refill available), so a SKU that lives long enough gets there,
// and every later order of it then failed its transaction ("integer out of
// range") and was dead-lettered, paid and never reserved. The SKU here has
// reserved 2^31 - 5 units over its life; the next order of 10 must be
// reserved like any other.
func TestReservedOutlivesInt32(t *testing.T) {
	t.Parallel()
	const lifetime = 1<<31 - 5
	pool := newDB(t, map[string]int{"a": 100})
	_, err := pool.Exec(t.Context(), `UPDATE stock SET reserved = $1 WHERE sku = 'a'`, lifetime)
	require.NoError(t, err)

	order := uuid.NewString()
	apply(t, pool, []*message.Message{orderPaid(t, order, events.Line{SKU: "a", Quantity: 10})})

	var available, reserved int64
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT available, reserved FROM stock WHERE sku = 'a'`).Scan(&available, &reserved))
	require.Equal(t, int64(90), available)
	require.Equal(t, int64(lifetime+10), reserved, "past the int range")
	require.Equal(t, [][]any{{order, "a", int32(10)}}, rowsOf(t, pool, `SELECT order_id, sku, quantity FROM reservations`))
}
