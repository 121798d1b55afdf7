package check

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
	rejections   map[string]int                        // order → rejection rows
	decisions    map[string]string                     // order → "reserved" or "rejected" (only the domain guard records them)
	stock        []stockRow
}

// skuReservations sums the reservation rows of one order and SKU.
type skuReservations struct {
	rows, quantity int // how many rows, and their quantities summed
	least, most    int // the smallest and largest quantity of one row
}

// stockRow is one SKU's stock beside the sum of its reservations.
type stockRow struct {
	sku                 string
	available, reserved int
	reservations        int
}

// reservationRows counts order id's reservation rows.
func (v inventoryView) reservationRows(id string) int {
	n := 0
	for _, s := range v.reservations[id] {
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
	return sortedKeys(ids)
}

func readInventory(ctx context.Context, pool *pgxpool.Pool) (inventoryView, error) {
	v := inventoryView{reservations: map[string]map[string]skuReservations{}, decisions: map[string]string{}}
	err := snapshot(ctx, pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			SELECT order_id, sku, count(*), sum(quantity), min(quantity), max(quantity)
			FROM reservations GROUP BY 1, 2`)
		if err != nil {
			return fmt.Errorf("reading reservations: %w", err)
		}
		var id, sku string
		var s skuReservations
		if _, err := pgx.ForEachRow(rows, []any{&id, &sku, &s.rows, &s.quantity, &s.least, &s.most}, func() error {
			if v.reservations[id] == nil {
				v.reservations[id] = map[string]skuReservations{}
			}
			v.reservations[id][sku] = s
			return nil
		}); err != nil {
			return fmt.Errorf("reading reservations: %w", err)
		}
		if v.rejections, err = countBy(ctx, tx, `SELECT order_id, count(*) FROM rejections GROUP BY 1`); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT order_id, decision FROM decisions`)
		if err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		var decision string
		if _, err := pgx.ForEachRow(rows, []any{&id, &decision}, func() error { v.decisions[id] = decision; return nil }); err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		rows, err = tx.Query(ctx, `
			SELECT s.sku, s.available, s.reserved, coalesce(sum(r.quantity), 0)::bigint
			FROM stock s LEFT JOIN reservations r ON r.sku = s.sku
			GROUP BY s.sku, s.available, s.reserved`)
		if err != nil {
			return fmt.Errorf("reading stock: %w", err)
		}
		var st stockRow
		if _, err := pgx.ForEachRow(rows, []any{&st.sku, &st.available, &st.reserved, &st.reservations}, func() error {
			v.stock = append(v.stock, st)
			return nil
		}); err != nil {
			return fmt.Errorf("reading stock: %w", err)
		}
		return nil
	})
	return v, err
}

// ordersView is what orders recorded, read in one snapshot.
type ordersView struct {
	orders    map[string]*order // every order, paid or not
	orderPaid map[string]int    // OrderPaid rows in the outbox, per order id
}

type order struct {
	status  string
	lines   map[string]int // quantity per SKU, summed over the order's lines
	answers map[string]int // answers applied (order_events), per event type
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
		rows, err := tx.Query(ctx, `SELECT id::text, status, lines FROM orders`)
		if err != nil {
			return fmt.Errorf("reading orders: %w", err)
		}
		var id, status string
		var lines []events.Line
		if _, err := pgx.ForEachRow(rows, []any{&id, &status, &lines}, func() error {
			v.orders[id] = &order{status: status, lines: sumLines(lines), answers: map[string]int{}}
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
		v.orderPaid, err = countBy(ctx, tx, `SELECT partition_key, count(*) FROM outbox_messages WHERE topic = $1 GROUP BY 1`, events.TopicOrders)
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
