// Package check verifies, with SQL against both services' databases, that a
// run applied every paid order exactly once and lost nothing. The demo, the
// end-to-end test and the chaos harness all judge a run with it.
package check

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/services/events"
)

// Invariant is one checked property.
type Invariant struct {
	Name   string
	OK     bool
	Detail string // what was found, in a sentence
}

// Report is the state of a finished run.
type Report struct {
	OrdersPaid    int // orders whose payment committed
	Reserved      int
	Rejected      int
	Unsettled     int // paid orders not reserved or rejected: lost, if the run is drained
	DoubleApplied int // paid orders applied more than once, on either side
	NotApplied    int // paid orders inventory never applied
	OrderPaidDup  int // orders with more than one OrderPaid in the outbox

	ReservationsMade     int            // reserved orders, as inventory counts them
	DuplicatesSuppressed int64          // redeliveries the inboxes skipped (the first layer)
	Refused              map[string]int // per service, events the domain guard refused (the second layer)
	OutboxPending        map[string]int // unpublished outbox rows per service
	Quarantined          map[string]int // "service/kind" → rows

	Invariants []Invariant
}

// RefusedTotal is how many events the domain guards refused in all.
func (r Report) RefusedTotal() int { return r.Refused["orders"] + r.Refused["inventory"] }

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	for _, inv := range r.Invariants {
		if !inv.OK {
			return false
		}
	}
	return true
}

// Invariant returns the named invariant.
func (r Report) Invariant(name string) (Invariant, bool) {
	for _, inv := range r.Invariants {
		if inv.Name == name {
			return inv, true
		}
	}
	return Invariant{}, false
}

// The invariants, by name.
const (
	ExactlyOnce     = "exactly-once"     // each paid order: one OrderPaid, one application in inventory, one answer applied in orders
	StockConsistent = "stock-consistent" // per SKU: reserved = Σ reservations, available + reserved = seeded, available ≥ 0
	NothingLost     = "nothing-lost"     // every paid order settled, both outboxes drained
)

// Run checks a drained run. seeded is the stock each SKU was given.
func Run(ctx context.Context, orders, inventory *pgxpool.Pool, seeded map[string]int) (Report, error) {
	r := Report{OutboxPending: map[string]int{}, Quarantined: map[string]int{}, Refused: map[string]int{}}

	// Paid orders and how many distinct SKUs each has (a reservation writes
	// one row per SKU).
	type order struct {
		status  string
		skus    int
		answers int // InventoryReserved/Rejected applied by orders
	}
	paid := map[string]*order{}
	rows, err := orders.Query(ctx, `
		SELECT o.id::text, o.status, o.lines,
		       (SELECT count(*) FROM order_events e WHERE e.order_id = o.id)
		FROM orders o WHERE o.status <> 'created'`)
	if err != nil {
		return r, fmt.Errorf("reading orders: %w", err)
	}
	for rows.Next() {
		var id string
		var o order
		var lines []events.Line
		if err := rows.Scan(&id, &o.status, &lines, &o.answers); err != nil {
			return r, fmt.Errorf("reading orders: %w", err)
		}
		skus := map[string]bool{}
		for _, l := range lines {
			skus[l.SKU] = true
		}
		o.skus = len(skus)
		paid[id] = &o
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("reading orders: %w", err)
	}
	r.OrdersPaid = len(paid)

	orderPaid, err := countBy(ctx, orders, `SELECT partition_key, count(*) FROM outbox_messages WHERE topic = $1 GROUP BY 1`, events.TopicOrders)
	if err != nil {
		return r, err
	}
	reservationRows, err := countBy(ctx, inventory, `SELECT order_id, count(*) FROM reservations GROUP BY 1`)
	if err != nil {
		return r, err
	}
	rejections, err := countBy(ctx, inventory, `SELECT order_id, count(*) FROM rejections GROUP BY 1`)
	if err != nil {
		return r, err
	}

	var examples []string
	for id, o := range paid {
		switch o.status {
		case "reserved":
			r.Reserved++
		case "rejected":
			r.Rejected++
		default:
			r.Unsettled++
		}
		applied := rejections[id]
		if n := reservationRows[id]; n > 0 {
			r.ReservationsMade++
			applied += (n + o.skus - 1) / o.skus // whole reservations, rounding a partial one up
			if n%o.skus != 0 {
				applied++ // a partial reservation is a defect of its own
			}
		}
		switch {
		case applied == 0:
			r.NotApplied++
		case applied > 1 || o.answers > 1 || orderPaid[id] > 1:
			r.DoubleApplied++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("order %s: %d OrderPaid, applied %d× by inventory, %d answers applied by orders", id, orderPaid[id], applied, o.answers))
			}
		}
		if orderPaid[id] > 1 {
			r.OrderPaidDup++
		}
	}
	detail := fmt.Sprintf("%d paid orders; %d applied more than once", r.OrdersPaid, r.DoubleApplied)
	if len(examples) > 0 {
		detail += ": " + strings.Join(examples, "; ")
	}
	r.Invariants = append(r.Invariants, Invariant{ExactlyOnce, r.DoubleApplied == 0, detail})

	inv, err := checkStock(ctx, inventory, seeded)
	if err != nil {
		return r, err
	}
	r.Invariants = append(r.Invariants, inv)

	for name, pool := range map[string]*pgxpool.Pool{"orders": orders, "inventory": inventory} {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE published_at IS NULL`).Scan(&n); err != nil {
			return r, fmt.Errorf("counting %s outbox: %w", name, err)
		}
		r.OutboxPending[name] = n
		var dups int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(duplicates), 0) FROM inbox_messages`).Scan(&dups); err != nil {
			return r, fmt.Errorf("counting %s duplicates: %w", name, err)
		}
		r.DuplicatesSuppressed += dups
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM refusals`).Scan(&n); err != nil {
			return r, fmt.Errorf("counting %s refusals: %w", name, err)
		}
		r.Refused[name] = n
		q, err := countBy(ctx, pool, `SELECT kind, count(*) FROM inbox_quarantine GROUP BY 1`)
		if err != nil {
			return r, err
		}
		for kind, n := range q {
			r.Quarantined[name+"/"+kind] = n
		}
	}
	lost := r.Unsettled + r.NotApplied
	r.Invariants = append(r.Invariants, Invariant{NothingLost,
		lost == 0 && r.OutboxPending["orders"] == 0 && r.OutboxPending["inventory"] == 0,
		fmt.Sprintf("%d paid orders unsettled, %d never applied by inventory; outbox rows pending: orders %d, inventory %d",
			r.Unsettled, r.NotApplied, r.OutboxPending["orders"], r.OutboxPending["inventory"])})
	return r, nil
}

func checkStock(ctx context.Context, inventory *pgxpool.Pool, seeded map[string]int) (Invariant, error) {
	var bad []string
	seen := map[string]bool{}
	rows, err := inventory.Query(ctx, `
		SELECT s.sku, s.available, s.reserved, coalesce(sum(r.quantity), 0)::int
		FROM stock s LEFT JOIN reservations r ON r.sku = s.sku
		GROUP BY s.sku, s.available, s.reserved`)
	if err != nil {
		return Invariant{}, fmt.Errorf("reading stock: %w", err)
	}
	for rows.Next() {
		var sku string
		var avail, reserved, sum int
		if err := rows.Scan(&sku, &avail, &reserved, &sum); err != nil {
			return Invariant{}, fmt.Errorf("reading stock: %w", err)
		}
		seen[sku] = true
		switch {
		case avail < 0:
			bad = append(bad, fmt.Sprintf("%s: available %d < 0", sku, avail))
		case reserved != sum:
			bad = append(bad, fmt.Sprintf("%s: reserved %d but reservations sum to %d", sku, reserved, sum))
		case seeded != nil && avail+reserved != seeded[sku]:
			bad = append(bad, fmt.Sprintf("%s: available %d + reserved %d ≠ seeded %d", sku, avail, reserved, seeded[sku]))
		}
	}
	if err := rows.Err(); err != nil {
		return Invariant{}, fmt.Errorf("reading stock: %w", err)
	}
	for sku := range seeded {
		if !seen[sku] {
			bad = append(bad, sku+": seeded but missing")
		}
	}
	sort.Strings(bad)
	detail := fmt.Sprintf("%d SKUs balance", len(seen))
	if len(bad) > 0 {
		detail = fmt.Sprintf("%d SKUs out of balance: %s", len(bad), strings.Join(bad[:min(3, len(bad))], "; "))
	}
	return Invariant{StockConsistent, len(bad) == 0, detail}, nil
}

func countBy(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (map[string]int, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sql, err)
	}
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

// Settled is the usual condition to wait for: at least paid orders paid,
// every one of them settled, and both outboxes drained.
func Settled(paid int) func(Report) bool {
	return func(r Report) bool {
		lost, _ := r.Invariant(NothingLost)
		return lost.OK && r.OrdersPaid >= paid
	}
}

// Wait runs the check every 200ms until done says the run is over or ctx
// ends, calling progress (when set) at most every two seconds. It returns the
// last report; when ctx ended first, the report's invariants say what is
// missing and the error says the deadline passed.
func Wait(ctx context.Context, orders, inventory *pgxpool.Pool, seeded map[string]int,
	done func(Report) bool, progress func(Report)) (Report, error) {
	var last Report
	lastProgress := time.Now()
	for {
		r, err := Run(ctx, orders, inventory, seeded)
		switch {
		case err == nil:
			last = r
			if done(r) {
				return r, nil
			}
		case ctx.Err() == nil:
			return r, err
		}
		if progress != nil && time.Since(lastProgress) > 2*time.Second {
			progress(last)
			lastProgress = time.Now()
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("not settled: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
