// Package judge holds every verdict a run of the reference system is judged
// by, each read with the judge's own SQL, its own Kafka client and the
// failpoint log, never through the services' code. Rules lists them: what
// each says, where it is judged, and the controls that must see it fail.
// The demo, the end-to-end tests and the chaos driver all judge with it.
//
// Run checks, with SQL against both services' databases, that a run applied
// every paid order exactly once, lost nothing, and did nothing nobody asked
// for. A checker that only counts what it expects to go wrong (double
// counts) passes a run that reserves stock for an order nobody paid. So
// besides exactly-once and nothing-lost, every effect must trace back to a
// committed cause (EffectsHaveCauses), every reservation must hold the
// order's own quantities (Quantities), and the paid orders must be, by id,
// the ones the client paid (ClientAgrees). CheckPayments holds the payment
// provider's ledger to the orders.
//
// A chaos run adds the verdicts on what its faults did: MeasureWindows and
// JudgeWindows (per crash window, what its kills' copies met, the effect
// windows' too), MeasureKeyOrder and OrderedVerdict (each key's order in
// Kafka), CheckTrace and TraceVerdict (the failpoint trace against the
// protocol's model), HostileOutcome and HostileVerdict (each hostile class
// refused with its reason), LayersVerdict and FaultsBitVerdict. Measuring
// reads the databases, Kafka and the failpoint log; a verdict is a pure
// function of what was measured, so its tests feed it the failures it
// rules out. Windows tells each crash window's story: the report's, the
// live demo's lesson's and chaos -scenario's.
package judge

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/services/events"
)

// Databases are the run's databases the verdicts read with their own SQL.
type Databases struct {
	Orders, Inventory *pgxpool.Pool
	Provider          *pgxpool.Pool // the payment provider stand-in's ledger
}

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

	Ended      int // orders captured in orders and ended (their units sold) in inventory
	NotEnded   int // orders captured in orders that inventory has not ended: lost, if the run is drained
	EndedTwice int // orders whose units inventory sold more than once, or with more than one OrderCaptured

	// Missing names, per order, the stage a drained run should have
	// reached and did not (Unsettled, NotApplied, NotEnded): Unfinished
	// follows each to its event in Kafka to tell "not finished" from "lost".
	Missing []MissingStage

	ReservationsMade     int            // reserved orders, as inventory counts them
	DuplicatesSuppressed int64          // redeliveries the inboxes skipped (the first layer)
	Refused              map[string]int // per service, events the domain guard refused (the second layer)
	OutboxPending        map[string]int // unpublished outbox rows per service
	CapturesPending      int            // payment captures recorded and not yet ended (pkg/effect)
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
	ExactlyOnce       = "exactly-once"        // each paid order: one OrderPaid, one application in inventory, one answer applied in orders
	EffectsHaveCauses = "effects-have-causes" // every reservation, rejection, decision and OrderPaid belongs to a paid order; every answer orders applied is inventory's decision
	Quantities        = "quantities"          // each reservation of an order holds, per SKU, exactly the order's lines
	StockConsistent   = "stock-consistent"    // per SKU: available = seeded − Σ reservations ≥ 0, reserved = Σ reservations − Σ fulfilments, sold = Σ fulfilments
	ClientAgrees      = "client-agrees"       // the paid orders are, by id, the ones the client paid (or could not tell)
	NothingLost       = "nothing-lost"        // every paid order settled, every captured order ended, both outboxes drained
)

// maxExamples bounds the examples an invariant's detail quotes.
const maxExamples = 3

// Run checks a drained run. seeded is the stock each SKU was given (nil:
// unknown, as when the databases hold earlier runs). client is the load
// generator's account of its orders (nil: none, as when the load came from
// elsewhere; ClientAgrees then says it was skipped).
func Run(ctx context.Context, orders, inventory *pgxpool.Pool, seeded map[string]int, client *Client) (Report, error) {
	r := Report{OutboxPending: map[string]int{}, Quarantined: map[string]int{}, Refused: map[string]int{}}

	// Inventory first, orders second: an effect in inventory is committed
	// after its cause in orders, and an order's status only moves forward,
	// so every cause of what the first read saw is in the second. Read the
	// other way round, a payment and its reservation committing between
	// the two reads would look like a reservation without a payment.
	inv, err := readInventory(ctx, inventory)
	if err != nil {
		return r, err
	}
	ord, err := readOrders(ctx, orders)
	if err != nil {
		return r, err
	}

	r.Invariants = append(r.Invariants, exactlyOnce(&r, ord, inv))
	var injected map[string]bool
	if client != nil {
		injected = map[string]bool{}
		for _, id := range client.Injected {
			injected[id] = true
		}
	}
	causes, err := effectsHaveCauses(ctx, inventory, ord, inv, injected)
	if err != nil {
		return r, err
	}
	r.Invariants = append(r.Invariants, causes, quantities(ord, inv), checkStock(inv.stock, seeded), clientAgrees(ord, client))

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
	if err := orders.QueryRow(ctx, `SELECT count(*) FROM effects WHERE state = 'pending'`).Scan(&r.CapturesPending); err != nil {
		return r, fmt.Errorf("counting pending captures: %w", err)
	}
	lost := r.Unsettled + r.NotApplied + r.NotEnded
	r.Invariants = append(r.Invariants, Invariant{NothingLost,
		lost == 0 && r.OutboxPending["orders"] == 0 && r.OutboxPending["inventory"] == 0 && r.CapturesPending == 0,
		fmt.Sprintf("%d paid orders unsettled, %d never applied by inventory, %d captured and not ended by inventory; outbox rows pending: orders %d, inventory %d; captures pending: %d",
			r.Unsettled, r.NotApplied, r.NotEnded, r.OutboxPending["orders"], r.OutboxPending["inventory"], r.CapturesPending)})
	return r, nil
}

// exactlyOnce counts, per paid order, its OrderPaid rows, inventory's
// applications and the answers orders applied, and fills r's counts.
func exactlyOnce(r *Report, ord ordersView, inv inventoryView) Invariant {
	var examples []string
	for _, id := range ord.ids() {
		o := ord.orders[id]
		if !o.paid() {
			continue
		}
		r.OrdersPaid++
		switch o.status {
		case "reserved":
			r.Reserved++
		case "rejected":
			r.Rejected++
		default:
			r.Unsettled++
			if inv.rejections[id]+inv.reservationRows(id) > 0 { // inventory decided: orders never applied the answer
				r.Missing = append(r.Missing, MissingStage{Order: id, Stage: StageAnswer})
			}
		}
		applied := inv.rejections[id]
		// A reservation writes one row per distinct SKU of the order.
		if n := inv.reservationRows(id); n > 0 {
			r.ReservationsMade++
			skus := max(len(o.lines), 1)
			applied += (n + skus - 1) / skus // whole reservations, rounding a partial one up
			if n%skus != 0 {
				applied++ // a partial reservation is a defect of its own
			}
		}
		switch {
		case applied == 0:
			r.NotApplied++
			r.Missing = append(r.Missing, MissingStage{Order: id, Stage: StagePaid})
		case applied > 1 || o.answerCount() > 1 || ord.orderPaid[id] > 1:
			r.DoubleApplied++
			if len(examples) < maxExamples {
				examples = append(examples, fmt.Sprintf("order %s: %d OrderPaid, applied %d× by inventory, %d answers applied by orders", id, ord.orderPaid[id], applied, o.answerCount()))
			}
		}
		if ord.orderPaid[id] > 1 {
			r.OrderPaidDup++
		}
		// An order ends (its units sold) when its payment is captured: one
		// OrderCaptured, applied once. fulfilments, like reservations, has
		// one row per SKU per application.
		ended := inv.fulfilmentRows(id)
		if ended > 0 {
			skus := max(len(inv.fulfilments[id]), 1)
			ended = (ended + skus - 1) / skus
		}
		switch {
		case ended > 1 || ord.orderCaptured[id] > 1:
			r.EndedTwice++
			if len(examples) < maxExamples {
				examples = append(examples, fmt.Sprintf("order %s: its units sold %d times, %d OrderCaptured in the orders outbox", id, ended, ord.orderCaptured[id]))
			}
		case ended == 1:
			r.Ended++
		case o.payment == "captured":
			r.NotEnded++
			r.Missing = append(r.Missing, MissingStage{Order: id, Stage: StageCaptured})
		}
	}
	detail := fmt.Sprintf("%d paid orders; %d applied more than once; %d ended, %d sold more than once", r.OrdersPaid, r.DoubleApplied, r.Ended, r.EndedTwice)
	if len(examples) > 0 {
		detail += ": " + strings.Join(examples, "; ")
	}
	return Invariant{ExactlyOnce, r.DoubleApplied == 0 && r.EndedTwice == 0, detail}
}

// checkStock holds each SKU to what it was seeded with: available =
// seeded − Σ reservations (a reserved unit leaves the shelf; selling it
// does not move it again), available ≥ 0, reserved = Σ reservations −
// Σ fulfilments (the units of orders still open), sold = Σ fulfilments,
// and no seeded SKU missing. Without seeded, available is not checked
// against it.
func checkStock(stock []stockRow, seeded map[string]int) Invariant {
	var bad []string
	seen := map[string]bool{}
	for _, s := range stock {
		seen[s.sku] = true
		var wrong []string
		if s.available < 0 {
			wrong = append(wrong, fmt.Sprintf("available %d < 0", s.available))
		}
		if s.reserved != s.reservations-s.fulfilments {
			wrong = append(wrong, fmt.Sprintf("reserved %d but reservations %d − fulfilments %d = %d", s.reserved, s.reservations, s.fulfilments, s.reservations-s.fulfilments))
		}
		if s.sold != s.fulfilments {
			wrong = append(wrong, fmt.Sprintf("sold %d but fulfilments sum to %d", s.sold, s.fulfilments))
		}
		if seeded != nil && s.available != seeded[s.sku]-s.reservations {
			wrong = append(wrong, fmt.Sprintf("available %d ≠ seeded %d − reservations %d", s.available, seeded[s.sku], s.reservations))
		}
		if len(wrong) > 0 {
			bad = append(bad, s.sku+": "+strings.Join(wrong, ", "))
		}
	}
	for sku := range seeded {
		if !seen[sku] {
			bad = append(bad, sku+": seeded but missing")
		}
	}
	sort.Strings(bad)
	detail := fmt.Sprintf("%d SKUs balance", len(seen))
	if seeded == nil {
		detail += " (seeded stock unknown: available not checked against it)"
	}
	if len(bad) > 0 {
		detail = fmt.Sprintf("%d SKUs out of balance: %s", len(bad), strings.Join(bad[:min(maxExamples, len(bad))], "; "))
	}
	return Invariant{StockConsistent, len(bad) == 0, detail}
}

func countBy(ctx context.Context, q querier, sql string, args ...any) (map[string]int, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sql, err)
	}
	defer rows.Close()
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

// Wait runs the check every 200ms (or as long as the last check took,
// whichever is longer) until done says the run is over or ctx
// ends, calling progress (when set) at most every two seconds. It returns the
// last report; when ctx ended first, the report's invariants say what is
// missing and the error says the deadline passed. seeded and client are
// Run's.
func Wait(ctx context.Context, orders, inventory *pgxpool.Pool, seeded map[string]int, client *Client,
	done func(Report) bool, progress func(Report)) (Report, error) {
	var last Report
	lastProgress := time.Now()
	for {
		started := time.Now()
		r, err := Run(ctx, orders, inventory, seeded, client)
		// A check reads every order of both databases: on a busy machine
		// it competes with the services it waits for, so it runs at most
		// half the time.
		pause := max(200*time.Millisecond, time.Since(started))
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
		case <-time.After(pause):
		}
	}
}

// sumLines returns an order's quantity per SKU, summed over its lines (an
// order may name a SKU on more than one line; inventory reserves the sum).
func sumLines(lines []events.Line) map[string]int {
	m := map[string]int{}
	for _, l := range lines {
		m[l.SKU] += l.Quantity
	}
	return m
}
