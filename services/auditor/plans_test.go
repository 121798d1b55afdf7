package main

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// TestRoundCostsWhatArrived: behind its watermark, a round reads what
// arrived since the last one, whatever the history: over 20,000 settled
// orders, a round after three more reads no more than a few dozen rows of
// any table, with the statements' generic plans (what a long-running
// auditor's prepared statements end up with).
func TestRoundCostsWhatArrived(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	const history = 20_000
	w.exec(w.orders, `INSERT INTO orders (id, status, lines, payment, paid_at, created_at)
		SELECT gen_random_uuid(), 'reserved', '[{"sku":"A","quantity":1}]', 'captured', now() - interval '2 hours' + i * interval '1 ms', now() - interval '3 hours'
		FROM generate_series(1, $1) i`, history)
	w.exec(w.orders, `ANALYZE orders`)
	// Inventory's side of the same orders, written from orders' ids.
	rows, err := w.orders.Query(t.Context(), `SELECT id::text FROM orders`)
	require.NoError(t, err)
	var ids []string
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	w.exec(w.inventory, `INSERT INTO decisions (order_id, decision, message_id, decided_at) SELECT id, 'reserved', 'm', now() - interval '2 hours' FROM unnest($1::text[]) id`, ids)
	for _, table := range []string{"reservations", "fulfilments"} {
		w.exec(w.inventory, `INSERT INTO `+table+` (order_id, sku, quantity, message_id, created_at) SELECT id, 'A', 1, 'm', now() - interval '2 hours' FROM unnest($1::text[]) id`, ids)
	}
	w.exec(w.inventory, `UPDATE stock SET sold = $1 WHERE sku = 'A'`, history)
	w.exec(w.inventory, `ANALYZE`)

	catchUp, err := audit.New(w.state, audit.Config{Grace: time.Minute, Batch: 5000}, domain{orders: w.orders, inventory: w.inventory, grace: time.Minute}.checks()...)
	require.NoError(t, err)
	_, err = catchUp.Round(t.Context())
	require.NoError(t, err)
	require.Empty(t, w.ever())

	for range 3 {
		w.add(order{status: "reserved", payment: "captured", lines: a2b1, decision: "reserved", reserved: a2b1, sold: a2b1, age: 30 * time.Minute})
	}
	generic := func(c *pgxpool.Config) {
		c.MaxConns = 4
		c.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	orders, ordersPlans := pgtest.Explained(t, w.orders, generic)
	inventory, inventoryPlans := pgtest.Explained(t, w.inventory, generic)
	a, err := audit.New(w.state, audit.Config{Grace: time.Minute, Batch: 5000}, domain{orders: orders, inventory: inventory, grace: time.Minute}.checks()...)
	require.NoError(t, err)
	for range 2 { // the second round: the statements prepared, their plans generic
		r, err := a.Round(t.Context())
		require.NoError(t, err)
		for _, c := range r.Checks {
			require.True(t, c.CaughtUp, c.Check)
		}
	}
	require.Empty(t, w.ever())
	ran := append(ordersPlans.Take(), inventoryPlans.Take()...)
	require.NotEmpty(t, ran)
	require.Empty(t, pgtest.Costly(ran, 50, "orders", "decisions", "reservations", "fulfilments"),
		"statements that read more than 50 rows of a table (20,000 of history) for three new orders")
}
