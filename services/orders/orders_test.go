package main

import (
	"testing"

	"github.com/outboxref/outbox-inbox/services/internal/platform"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// newDB returns a pool on a fresh database with the orders schema and the
// outbox.
func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	pool := pg.TestDatabase(t)
	require.NoError(t, outbox.Migrate(ctx, pool))
	require.NoError(t, effect.Migrate(ctx, pool))
	svc := Service()
	require.NoError(t, migrate.Apply(ctx, pool, svc.Name, svc.Migrations))
	return pool
}

var oneLine = []events.Line{{SKU: "a", Quantity: 1}}

func newOrder(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	o, err := createOrder(t.Context(), platform.DB{Pool: pool}, oneLine, defaultCard)
	require.NoError(t, err)
	return o.ID
}

func scalar[T any](t *testing.T, pool *pgxpool.Pool, q string, args ...any) T {
	t.Helper()
	var v T
	require.NoError(t, pool.QueryRow(t.Context(), q, args...).Scan(&v), q)
	return v
}

// TestPayOrders pays one batch holding new orders, an order paid before,
// the same order twice, an unknown id and a malformed one: every request
// gets its own answer, and each order gets exactly one OrderPaid.
func TestPayOrders(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	a, b, before := newOrder(t, pool), newOrder(t, pool), newOrder(t, pool)
	_, err := payOrders(t.Context(), platform.DB{Pool: pool}, []string{before})
	require.NoError(t, err)
	unknown := uuid.NewString()

	res, err := payOrders(t.Context(), platform.DB{Pool: pool}, []string{a, before, b, a, unknown, "not-a-uuid"})
	require.NoError(t, err)
	require.Len(t, res, 6)
	for i, id := range []string{a, before, b, a} {
		require.NoError(t, res[i].err, id)
		require.Equal(t, id, res[i].order.ID)
		require.Equal(t, "paid", res[i].order.Status)
		require.Equal(t, oneLine, res[i].order.Lines)
	}
	require.ErrorIs(t, res[4].err, errNotFound)
	require.ErrorIs(t, res[5].err, errNotFound)
	for _, id := range []string{a, b, before} {
		require.Equal(t, 1, scalar[int](t, pool, `SELECT count(*) FROM outbox_messages WHERE partition_key = $1`, id), id)
	}
	require.Equal(t, 3, scalar[int](t, pool, `SELECT count(*) FROM outbox_messages`))
}

func answer(t *testing.T, ev any) *message.Message {
	t.Helper()
	payload, err := events.Encode(ev)
	require.NoError(t, err)
	return message.NewMessage(uuid.NewString(), payload)
}

// TestSettleOrders applies a batch of answers, one order answered twice
// within it, then a second answer under a fresh id in a later transaction:
// the guard refuses both and records why. An answer for an unknown order or
// an unpaid one, or a reservation of other lines than the order's, is a
// permanent error.
func TestSettleOrders(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	reserved, rejected, created := newOrder(t, pool), newOrder(t, pool), newOrder(t, pool)
	_, err := payOrders(t.Context(), platform.DB{Pool: pool}, []string{reserved, rejected})
	require.NoError(t, err)
	settle := func(msgs ...*message.Message) error {
		return pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error { return settleOrders(t.Context(), tx, msgs) })
	}

	require.NoError(t, settle(
		answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, reserved), Lines: oneLine}),
		answer(t, events.InventoryRejected{Envelope: events.NewEnvelope(events.TypeInventoryRejected, rejected), Reason: "short"}),
		answer(t, events.InventoryRejected{Envelope: events.NewEnvelope(events.TypeInventoryRejected, reserved), Reason: "second answer"}),
	))
	require.Equal(t, "reserved", scalar[string](t, pool, `SELECT status FROM orders WHERE id = $1`, reserved), "the first answer settles")
	require.Equal(t, "rejected", scalar[string](t, pool, `SELECT status FROM orders WHERE id = $1`, rejected))
	require.Equal(t, "short", scalar[string](t, pool, `SELECT reject_reason FROM orders WHERE id = $1`, rejected))
	require.Equal(t, 1, scalar[int](t, pool, `SELECT count(*) FROM order_events WHERE order_id = $1`, reserved), "one answer applied")
	require.Equal(t, 1, scalar[int](t, pool, `SELECT count(*) FROM refusals WHERE order_id = $1 AND reason LIKE 'order already settled%'`, reserved), "the second refused")

	require.NoError(t, settle(answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, rejected), Lines: oneLine})))
	require.Equal(t, "rejected", scalar[string](t, pool, `SELECT status FROM orders WHERE id = $1`, rejected))
	require.Equal(t, 1, scalar[int](t, pool, `SELECT count(*) FROM order_events WHERE order_id = $1`, rejected), "a later second answer is not applied")
	require.Equal(t, 1, scalar[int](t, pool, `SELECT count(*) FROM refusals WHERE order_id = $1`, rejected), "but refused with its reason")

	other := newOrder(t, pool)
	_, err = payOrders(t.Context(), platform.DB{Pool: pool}, []string{other})
	require.NoError(t, err)
	err = settle(answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, other), Lines: []events.Line{{SKU: "a", Quantity: 2}}}))
	require.True(t, inbox.IsPermanent(err), "other lines than the order's: %v", err)
	require.ErrorContains(t, err, "but the order holds")

	err = settle(answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, uuid.NewString()), Lines: oneLine}))
	require.True(t, inbox.IsPermanent(err), "unknown order: %v", err)
	require.ErrorContains(t, err, "does not exist")
	err = settle(answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, created), Lines: oneLine}))
	require.True(t, inbox.IsPermanent(err), "unpaid order: %v", err)
	require.ErrorContains(t, err, "never paid")
	err = settle(answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, "nope"), Lines: oneLine}))
	require.True(t, inbox.IsPermanent(err))
}

// TestSettleOrdersUnguarded is the second control run's configuration: with
// the guard off, a second answer is applied (recorded as one), which is what
// the checker then catches.
func TestSettleOrdersUnguarded(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	id := newOrder(t, pool)
	_, err := payOrders(t.Context(), platform.DB{Pool: pool}, []string{id})
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
			return settler{unguarded: true}.apply(t.Context(), tx, []*message.Message{
				answer(t, events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, id), Lines: oneLine})})
		}))
	}
	require.Equal(t, 2, scalar[int](t, pool, `SELECT count(*) FROM order_events WHERE order_id = $1`, id))
	require.Zero(t, scalar[int](t, pool, `SELECT count(*) FROM refusals`))
}
