package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/outboxref/outbox-inbox/services/internal/platform"

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

// TestSoldOutlivesInt32 drives a SKU's sold units past 2^31 - 1, the range
// of the int column its reserved units were first kept in, when reserved
// only grew. reserved now falls as orders end, but sold grows over every
// restock, so a SKU that lives long enough gets there, and an int column
// would then fail every later capture's transaction ("integer out of
// range"): the OrderCaptured dead-lettered, the order never ended. The SKU
// here has sold 2^31 - 5 units over its life; the next order of 10 must be
// reserved and sold like any other.
func TestSoldOutlivesInt32(t *testing.T) {
	t.Parallel()
	const lifetime = 1<<31 - 5
	pool := newDB(t, map[string]int{"a": 100})
	_, err := pool.Exec(t.Context(), `UPDATE stock SET sold = $1 WHERE sku = 'a'`, lifetime)
	require.NoError(t, err)

	order := uuid.NewString()
	apply(t, pool, []*message.Message{orderPaid(t, order, events.Line{SKU: "a", Quantity: 10})})
	apply(t, pool, []*message.Message{orderCaptured(t, order)})

	require.Equal(t, [][]any{{int32(90), int64(0), int64(lifetime + 10)}}, rowsOf(t, pool, `SELECT available, reserved, sold FROM stock WHERE sku = 'a'`), "past the int range")
	require.Equal(t, [][]any{{order, "a", int32(10)}}, rowsOf(t, pool, `SELECT order_id, sku, quantity FROM fulfilments`))
}

func orderCaptured(t *testing.T, orderID string) *message.Message {
	t.Helper()
	payload, err := events.Encode(events.OrderCaptured{
		Envelope: events.NewEnvelope(events.TypeOrderCaptured, orderID), CaptureID: "cap_" + orderID[:8],
	})
	require.NoError(t, err)
	return message.NewMessage(uuid.NewString(), payload)
}

// TestCaptureSellsReserved: an order ends when orders captures its payment,
// and its reserved units become sold: reserved falls back to the units of
// the orders still open (it no longer only grows), available does not move.
// The guard ends an order once, and only one inventory reserved in an
// earlier transaction: a second OrderCaptured under a fresh id, one for an
// order never seen, one for a rejected order and one in the same batch as
// its order's OrderPaid are refused with their reasons, and the stock is as
// the genuine capture left it. Unguarded, a second capture sells twice
// (what the stock check must see).
func TestCaptureSellsReserved(t *testing.T) {
	t.Parallel()
	one, two, rejected, never, sameBatch := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	pool := newDB(t, map[string]int{"a": 10, "b": 5})
	apply(t, pool, []*message.Message{
		orderPaid(t, one, events.Line{SKU: "a", Quantity: 3}, events.Line{SKU: "b", Quantity: 1}, events.Line{SKU: "a", Quantity: 1}),
		orderPaid(t, two, events.Line{SKU: "a", Quantity: 2}),
		orderPaid(t, rejected, events.Line{SKU: "b", Quantity: 50}),
	})
	stock := `SELECT sku, available, reserved, sold FROM stock ORDER BY sku`
	require.Equal(t, [][]any{{"a", int32(4), int64(6), int64(0)}, {"b", int32(4), int64(1), int64(0)}}, rowsOf(t, pool, stock))

	apply(t, pool, []*message.Message{orderCaptured(t, one)})
	sold := [][]any{{"a", int32(4), int64(2), int64(4)}, {"b", int32(4), int64(0), int64(1)}}
	require.Equal(t, sold, rowsOf(t, pool, stock), "order one's 4 a and 1 b sold, order two's 2 a still held")

	apply(t, pool, []*message.Message{orderCaptured(t, one), orderCaptured(t, never), orderCaptured(t, rejected)})
	apply(t, pool, []*message.Message{orderPaid(t, sameBatch, events.Line{SKU: "b", Quantity: 1}), orderCaptured(t, sameBatch)})
	require.Equal(t, [][]any{{"a", int32(4), int64(2), int64(4)}, {"b", int32(3), int64(1), int64(1)}}, rowsOf(t, pool, stock),
		"the refused captures sold nothing; sameBatch is reserved, not sold")
	refused := rowsOf(t, pool, `SELECT order_id, reason FROM refusals ORDER BY id`)
	require.Len(t, refused, 4)
	for i, want := range []struct{ order, reason string }{
		{one, "the order has already ended: fulfilled by message"},
		{never, "inventory has not decided this order"},
		{rejected, "the order was rejected by message"},
		{sameBatch, "captured before inventory's decision (reserved, by message"},
	} {
		require.Equal(t, want.order, refused[i][0])
		require.Contains(t, refused[i][1], want.reason)
	}
	require.Equal(t, [][]any{{one, int64(2)}}, rowsOf(t, pool, `SELECT order_id, count(*) FROM fulfilments GROUP BY 1`), "one row per SKU, once")

	// Unguarded, a second capture sells again; a third finds too few units
	// reserved and floors reserved at zero rather than failing forever.
	unguarded := newDB(t, map[string]int{"a": 10})
	apply(t, unguarded, []*message.Message{orderPaid(t, one, events.Line{SKU: "a", Quantity: 3}), orderPaid(t, two, events.Line{SKU: "a", Quantity: 2})})
	for _, want := range [][]any{{"a", int32(5), int64(2), int64(3)}, {"a", int32(5), int64(0), int64(6)}, {"a", int32(5), int64(0), int64(9)}} {
		require.NoError(t, pgx.BeginFunc(t.Context(), unguarded, func(tx pgx.Tx) error {
			return reserver{unguarded: true}.apply(t.Context(), tx, []*message.Message{orderCaptured(t, one)})
		}))
		require.Equal(t, [][]any{want}, rowsOf(t, unguarded, stock), "unguarded: sold again")
	}
}

// TestConcurrentCapturesSellOnce: two OrderCaptured of one order under two
// ids, applied by two batches at the same time (two partitions, two
// workers), both read the order as not ended before either commits. The
// second to commit must not sell again: it fails and, retried, is refused.
// Before the end was recorded only where it had not been, both sold.
func TestConcurrentCapturesSellOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	order, open := uuid.NewString(), uuid.NewString()
	pool := newDB(t, map[string]int{"a": 10})
	// Another open order holds units of the SKU too, so that reserved's
	// CHECK cannot stop a second sale: only the guard can.
	apply(t, pool, []*message.Message{orderPaid(t, order, events.Line{SKU: "a", Quantity: 3}), orderPaid(t, open, events.Line{SKU: "a", Quantity: 3})})

	first, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, reserveOrders(ctx, first, []*message.Message{orderCaptured(t, order)}))
	second := make(chan error, 1)
	go func() { // blocks on the stock row the first holds
		second <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return reserveOrders(ctx, tx, []*message.Message{orderCaptured(t, order)})
		})
	}()
	time.Sleep(300 * time.Millisecond) // let the second read the decisions and wait
	require.NoError(t, first.Commit(ctx))
	err = <-second
	require.ErrorContains(t, err, "ended meanwhile")
	apply(t, pool, []*message.Message{orderCaptured(t, order)}) // the retry
	require.Equal(t, [][]any{{int32(4), int64(3), int64(3)}}, rowsOf(t, pool, `SELECT available, reserved, sold FROM stock`))
	require.Equal(t, [][]any{{int64(3)}}, rowsOf(t, pool, `SELECT sum(quantity) FROM fulfilments`))
	require.Len(t, rowsOf(t, pool, `SELECT 1 FROM refusals`), 1, "the retried capture is refused")
}

// TestStatementsStayCheapAsTheTablesGrow: a service that started on empty
// tables, as a new deployment does, reads a few rows of them per order once
// they hold a history, with no ANALYZE since. Before, ending an order
// (UPDATE decisions … FROM unnest) kept the plan its statement was prepared
// with while decisions was empty, a hash join over a full scan, and read
// every decision ever made for each batch of captures.
func TestStatementsStayCheapAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base := newDB(t, map[string]int{"a": 1_000_000})
	for _, table := range []string{"stock", "decisions", "reservations", "fulfilments", "refusals", "rejections", "outbox_messages"} {
		_, err := base.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = off)`) // no ANALYZE replans behind the test
		require.NoError(t, err)
	}
	pool, plans := pgtest.Explained(t, base, func(c *pgxpool.Config) { c.MaxConns = 1 }) // one session: each statement prepared once
	order := func() {
		id := uuid.NewString()
		apply(t, pool, []*message.Message{orderPaid(t, id, events.Line{SKU: "a", Quantity: 1})})
		apply(t, pool, []*message.Message{orderCaptured(t, id)})
	}
	// A new deployment: the statements are prepared on tables that hold a
	// few rows, with the statistics autovacuum's first ANALYZE leaves (it
	// runs at 50 rows); from the sixth run Postgres may keep a generic plan
	// made for tables that small, where a full scan costs less than an index.
	for range 2 {
		order()
	}
	_, err := base.Exec(ctx, `ANALYZE`)
	require.NoError(t, err)
	for range 8 {
		order()
	}
	_, err = base.Exec(ctx, `
		WITH o AS (SELECT gen_random_uuid()::text AS id, gen_random_uuid()::text AS msg FROM generate_series(1, 20000))
		, d AS (INSERT INTO decisions (order_id, decision, message_id) SELECT id, 'reserved', msg FROM o)
		INSERT INTO reservations (order_id, sku, quantity, message_id) SELECT id, 'a', 1, msg FROM o`)
	require.NoError(t, err)
	// The catalogue grows too, through the stock API, behind a running
	// service: 20,000 more SKUs.
	require.NoError(t, setStock(ctx, platform.DB{Pool: base}, stockLevels(20000)))
	plans.Take()
	for range 3 {
		order()
	}
	ran := plans.Take()
	ended := 0
	for _, p := range ran {
		if strings.Contains(p.Query, "UPDATE decisions") {
			ended++
		}
	}
	require.Empty(t, pgtest.Costly(ran, 20, "stock", "decisions", "reservations", "fulfilments"), "statements that read more than 20 rows (20,000 orders of history) for one order")
	require.Equal(t, 3, ended, "the three orders' ends were not all explained")
}

// stockLevels is n SKUs, sku-1 to sku-n, 10 units each.
func stockLevels(n int) []StockLevel {
	levels := make([]StockLevel, n)
	for i := range levels {
		levels[i] = StockLevel{SKU: fmt.Sprintf("sku-%d", i+1), Available: 10}
	}
	return levels
}
