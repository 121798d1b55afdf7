package judge

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/services/events"
)

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// inventoryView is what inventory recorded, read in one snapshot: a
// reservation and its decision commit together, and read in two statements
// at read committed, the second could see a decision whose reservation the
// first did not.
type inventoryView struct {
	reservations map[string]map[string]skuReservations // order → SKU → its reservation rows
	fulfilments  map[string]map[string]skuReservations // order → SKU → its fulfilment rows (the order ended, its units sold)
	rejections   map[string]int                        // order → rejection rows
	decisions    map[string]string                     // order → "reserved" or "rejected" (only the domain guard records them)
	ended        map[string]bool                       // order → the guard recorded it ended (decisions.fulfilled_by)
	stock        []stockRow
}

// skuReservations sums the reservation (or fulfilment) rows of one order
// and SKU.
type skuReservations struct {
	rows, quantity int // how many rows, and their quantities summed
	least, most    int // the smallest and largest quantity of one row
}

// stockRow is one SKU's stock beside the sums of its reservations and
// fulfilments.
type stockRow struct {
	sku                       string
	available, reserved, sold int
	reservations, fulfilments int
}

// reservationRows counts order id's reservation rows.
func (v inventoryView) reservationRows(id string) int { return rowsOf(v.reservations[id]) }

// fulfilmentRows counts order id's fulfilment rows.
func (v inventoryView) fulfilmentRows(id string) int { return rowsOf(v.fulfilments[id]) }

func rowsOf(perSKU map[string]skuReservations) int {
	n := 0
	for _, s := range perSKU {
		n += s.rows
	}
	return n
}

// effectOrders returns every order id inventory recorded an effect for,
// sorted.
func (v inventoryView) effectOrders() []string {
	ids := map[string]bool{}
	for id := range v.reservations {
		ids[id] = true
	}
	for id := range v.rejections {
		ids[id] = true
	}
	for id := range v.decisions {
		ids[id] = true
	}
	for id := range v.fulfilments {
		ids[id] = true
	}
	return sortedKeys(ids)
}

func readInventory(ctx context.Context, pool *pgxpool.Pool) (inventoryView, error) {
	v := inventoryView{decisions: map[string]string{}, ended: map[string]bool{}}
	err := snapshot(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if v.reservations, err = perOrderAndSKU(ctx, tx, "reservations"); err != nil {
			return err
		}
		if v.fulfilments, err = perOrderAndSKU(ctx, tx, "fulfilments"); err != nil {
			return err
		}
		if v.rejections, err = countBy(ctx, tx, `SELECT order_id, count(*) FROM rejections GROUP BY 1`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT order_id, decision, fulfilled_by IS NOT NULL FROM decisions`)
		if err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		var id, decision string
		var ended bool
		if _, err := pgx.ForEachRow(rows, []any{&id, &decision, &ended}, func() error {
			v.decisions[id] = decision
			if ended {
				v.ended[id] = true
			}
			return nil
		}); err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		rows, err = tx.Query(ctx, `
			SELECT s.sku, s.available, s.reserved, s.sold,
				coalesce((SELECT sum(quantity) FROM reservations r WHERE r.sku = s.sku), 0)::bigint,
				coalesce((SELECT sum(quantity) FROM fulfilments f WHERE f.sku = s.sku), 0)::bigint
			FROM stock s`)
		if err != nil {
			return fmt.Errorf("reading stock: %w", err)
		}
		var st stockRow
		if _, err := pgx.ForEachRow(rows, []any{&st.sku, &st.available, &st.reserved, &st.sold, &st.reservations, &st.fulfilments}, func() error {
			v.stock = append(v.stock, st)
			return nil
		}); err != nil {
			return fmt.Errorf("reading stock: %w", err)
		}
		return nil
	})
	return v, err
}

// perOrderAndSKU sums the rows of table (reservations or fulfilments) per
// order and SKU.
func perOrderAndSKU(ctx context.Context, tx pgx.Tx, table string) (map[string]map[string]skuReservations, error) {
	rows, err := tx.Query(ctx, `
		SELECT order_id, sku, count(*), sum(quantity), min(quantity), max(quantity)
		FROM `+table+` GROUP BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	out := map[string]map[string]skuReservations{}
	var id, sku string
	var s skuReservations
	if _, err := pgx.ForEachRow(rows, []any{&id, &sku, &s.rows, &s.quantity, &s.least, &s.most}, func() error {
		if out[id] == nil {
			out[id] = map[string]skuReservations{}
		}
		out[id][sku] = s
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	return out, nil
}

// ordersView is what orders recorded, read in one snapshot.
type ordersView struct {
	orders        map[string]*order // every order, paid or not
	orderPaid     map[string]int    // OrderPaid rows in the outbox, per order id
	orderCaptured map[string]int    // OrderCaptured rows in the outbox, per order id
}

type order struct {
	status  string
	payment string         // "", "capturing", "captured", "declined", "failed", "refunding", "refunded", "refund_failed"
	lines   map[string]int // quantity per SKU, summed over the order's lines
	answers map[string]int // answers applied (order_events), per event type
}

// captured reports whether the order's payment was captured: it is, or it
// was and its refund was asked for since.
func (o *order) captured() bool {
	switch o.payment {
	case "captured", "refunding", "refunded", "refund_failed":
		return true
	}
	return false
}

// paid reports whether the order's payment committed.
func (o *order) paid() bool { return o.status != "created" }

func (o *order) answerCount() int {
	n := 0
	for _, c := range o.answers {
		n += c
	}
	return n
}

// ids returns the order ids, sorted, so that details quote the same
// examples on every run.
func (v ordersView) ids() []string {
	ids := make([]string, 0, len(v.orders))
	for id := range v.orders {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func readOrders(ctx context.Context, pool *pgxpool.Pool) (ordersView, error) {
	v := ordersView{orders: map[string]*order{}}
	err := snapshot(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id::text, status, coalesce(payment, ''), lines FROM orders`)
		if err != nil {
			return fmt.Errorf("reading orders: %w", err)
		}
		var id, status, payment string
		var lines []events.Line
		if _, err := pgx.ForEachRow(rows, []any{&id, &status, &payment, &lines}, func() error {
			v.orders[id] = &order{status: status, payment: payment, lines: sumLines(lines), answers: map[string]int{}}
			lines = nil // the next row decodes into a new slice
			return nil
		}); err != nil {
			return fmt.Errorf("reading orders: %w", err)
		}
		rows, err = tx.Query(ctx, `SELECT order_id::text, event, count(*) FROM order_events GROUP BY 1, 2`)
		if err != nil {
			return fmt.Errorf("reading order events: %w", err)
		}
		var event string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&id, &event, &n}, func() error {
			if o := v.orders[id]; o != nil { // order_events references orders
				o.answers[event] = n
			}
			return nil
		}); err != nil {
			return fmt.Errorf("reading order events: %w", err)
		}
		v.orderPaid, err = countBy(ctx, tx, `SELECT partition_key, count(*) FROM outbox_messages
			WHERE topic = $1 AND `+events.OutboxType+` = $2 GROUP BY 1`, events.TopicOrders, events.TypeOrderPaid)
		if err != nil {
			return err
		}
		v.orderCaptured, err = countBy(ctx, tx, `SELECT partition_key, count(*) FROM outbox_messages
			WHERE topic = $1 AND `+events.OutboxType+` = $2 GROUP BY 1`, events.TopicOrders, events.TypeOrderCaptured)
		return err
	})
	return v, err
}

// snapshot runs fn in a read-only repeatable-read transaction: every
// statement in it sees the database as of the first one.
func snapshot(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
