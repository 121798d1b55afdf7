package main

// The domain's checks: each the incremental form of one of the invariants
// the chaos judge proves after a run (chaos/judge), examined on the live
// system behind a watermark (pkg/audit).
//
//   - orders: every paid order, once it is older than the grace period,
//     is answered; its answer is inventory's decision; a reserved order's
//     reservation holds its lines; a captured order is sold, its lines
//     exactly, once.
//   - decisions: every decision inventory made is for an order that was
//     paid (none for an order orders never had, or never paid).
//   - sales: every sale (fulfilment) is of an order whose payment was
//     captured.
//   - refunds: every refund asked for, once older than the grace period,
//     has ended refunded.
//   - stock (ledger.go): per SKU, reserved = Σ reservations − Σ
//     fulfilments and sold = Σ fulfilments, kept as a running ledger.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/services/events"
)

// The kinds of finding, by check. The runbook (docs/operate.md) has one
// entry per kind.
const (
	// orders
	KindUnanswered          = "unanswered"              // paid, and inventory has not decided
	KindAnswerUnapplied     = "answer-unapplied"        // inventory decided, orders has not applied it
	KindAnswerWithoutDecide = "answer-without-decision" // orders applied an answer inventory never gave
	KindAnswersDisagree     = "answers-disagree"        // orders says reserved, inventory rejected (or the reverse)
	KindWrongQuantities     = "wrong-quantities"        // the reservation does not hold the order's lines
	KindCapturePending      = "capture-pending"         // reserved, and its capture has not ended
	KindSaleMissing         = "sale-missing"            // captured, and inventory has not sold its units
	KindWrongSale           = "wrong-sale"              // the units sold are not the order's lines (sold twice, or others)
	KindUnreadable          = "unreadable"              // the order's row cannot be read (its lines are not lines)

	// decisions
	KindDecisionWithoutOrder   = "decision-without-order"   // inventory decided an order orders does not have
	KindDecisionWithoutPayment = "decision-without-payment" // inventory decided an order that was never paid
	// sales
	KindSaleWithoutCapture = "sale-without-capture" // inventory sold an order whose payment was not captured
	// refunds
	KindRefundPending = "refund-pending" // a refund asked for has not ended
	KindRefundFailed  = "refund-failed"  // the provider refused a refund for good: the customer is still charged
)

// domain is what the checks read: both services' databases.
type domain struct {
	orders, inventory *pgxpool.Pool
	// grace is the auditor's grace period: a stage of an order (its answer
	// applied, its capture recorded) is held to the next only once it is
	// older than this, on a recheck too.
	grace time.Duration
	// repair, when set, is asked for the repairs the domain can make
	// (repair.go); nil: findings are only reported.
	repair *ordersAPI
}

// horizon is how far a scan may go: grace ago ($N, in seconds), and never
// past the start of the oldest transaction open on the database. An
// entity's time is its writer's now(), the start of its transaction, and
// rows become visible when it commits: a transaction still open may commit
// an entity whose time a watermark has already passed. Reading other
// sessions' xact_start needs pg_read_all_stats (or a superuser); without
// it the grace period alone bounds the scan, and a writer open longer than
// the grace period can be skipped.
func horizon(graceParam int) string {
	return fmt.Sprintf(`LEAST(now() - make_interval(secs => $%d), coalesce((SELECT min(xact_start) FROM pg_stat_activity
		WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()), 'infinity'))`, graceParam)
}

// checks returns the domain's checks.
func (d domain) checks() []audit.Check {
	orders := audit.Entities("orders", d.ordersBy("paid_at", "paid orders"), d.examine(orderRule))
	if d.repair != nil {
		orders.Repair = d.repairOrder
	}
	return []audit.Check{
		orders,
		audit.Entities("decisions", d.nextDecisions, d.examine(decisionRule)),
		d.salesCheck(),
		audit.Entities("refunds", d.ordersBy("refund_at", "refunds"), d.examine(refundRule)),
		d.stockCheck(),
	}
}

// seconds is a duration as SQL's make_interval takes it.
func seconds(d time.Duration) float64 { return d.Seconds() }

// ordersBy lists the orders past the watermark by (column, id), a
// timestamp set once (paid_at: index orders_paid; refund_at: index
// orders_refund); what names them in an error.
func (d domain) ordersBy(column, what string) func(context.Context, audit.Mark, time.Duration, int) ([]audit.Entity, error) {
	query := `SELECT id::text, ` + column + ` FROM orders
		WHERE ` + column + ` IS NOT NULL AND (` + column + `, id) > ($1, $2::uuid) AND ` + column + ` < ` + horizon(3) + `
		ORDER BY ` + column + `, id LIMIT $4`
	return func(ctx context.Context, from audit.Mark, grace time.Duration, limit int) ([]audit.Entity, error) {
		key := from.Key
		if key == "" {
			key = uuid.Nil.String()
		}
		rows, err := d.orders.Query(ctx, query, since(from.Time), key, seconds(grace), limit)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		return pgx.CollectRows(rows, pgx.RowToStructByPos[audit.Entity])
	}
}

// nextDecisions lists inventory's decisions past the watermark, by
// (decided_at, order_id) (index decisions_decided).
func (d domain) nextDecisions(ctx context.Context, from audit.Mark, grace time.Duration, limit int) ([]audit.Entity, error) {
	rows, err := d.inventory.Query(ctx, `SELECT order_id, decided_at FROM decisions
		WHERE (decided_at, order_id) > ($1, $2) AND decided_at < `+horizon(3)+`
		ORDER BY decided_at, order_id LIMIT $4`, since(from.Time), from.Key, seconds(grace), limit)
	if err != nil {
		return nil, fmt.Errorf("listing decisions: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[audit.Entity])
}

// orderView is one order as both services recorded it.
type orderView struct {
	found      bool
	status     string // created, paid, reserved, rejected
	payment    string // "", capturing, captured, declined, failed, refunding, refunded, refund_failed
	lines      map[string]int
	decision   string // "", reserved, rejected
	rejected   bool   // inventory recorded a rejection
	unreadable string // why its row could not be read ("": it could)
	// An answer applied (orders' settled_at) longer ago than the grace
	// period is held to inventory's decision; so is a refund asked for
	// (refund_at) to its end.
	settledOld, refundOld bool
	// salesBefore: the capture was recorded before inventory learnt to
	// sell (its migration 004): no OrderCaptured was ever published for it.
	salesBefore bool
	reserved    map[string]int // units reserved per SKU
	sold        map[string]int // units sold per SKU
}

// readOrders reads ids as both services recorded them: inventory first,
// then orders (an effect in inventory commits after its cause in orders,
// and an order's state only moves forward, so every cause of what the
// first read saw is in the second).
func (d domain) readOrders(ctx context.Context, ids []string) (map[string]*orderView, error) {
	views := map[string]*orderView{}
	for _, id := range ids {
		views[id] = &orderView{reserved: map[string]int{}, sold: map[string]int{}}
	}
	salesSince, err := d.readInventory(ctx, ids, views)
	if err != nil {
		return nil, err
	}
	for _, v := range views {
		switch {
		case v.decision != "":
		case len(v.reserved) > 0:
			v.decision = "reserved"
		case v.rejected:
			v.decision = "rejected"
		}
	}
	if err := d.readOrdersOf(ctx, ids, views, salesSince); err != nil {
		return nil, err
	}
	return views, nil
}

// readInventory reads into views, in one snapshot of inventory's database,
// what inventory decided for ids and what it reserved and sold, and
// returns when it learnt to sell.
func (d domain) readInventory(ctx context.Context, ids []string, views map[string]*orderView) (salesSince pgtype.Timestamptz, err error) {
	err = snapshot(ctx, d.inventory, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT applied_at FROM schema_migrations WHERE component = 'inventory' AND version = 4), '-infinity')`).
			Scan(&salesSince); err != nil {
			return fmt.Errorf("reading when inventory learnt to sell: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT order_id, decision FROM decisions WHERE order_id = ANY($1)`, ids)
		if err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		var id, s string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&id, &s}, func() error { views[id].decision = s; return nil }); err != nil {
			return fmt.Errorf("reading decisions: %w", err)
		}
		// decisions is the domain guard's record; what inventory did is in
		// its reservations and rejections too, and with no decision row
		// (a guard switched off, rows written by hand) they say what it
		// decided.
		rows, err = tx.Query(ctx, `SELECT order_id FROM rejections WHERE order_id = ANY($1) GROUP BY 1`, ids)
		if err != nil {
			return fmt.Errorf("reading rejections: %w", err)
		}
		if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { views[id].rejected = true; return nil }); err != nil {
			return fmt.Errorf("reading rejections: %w", err)
		}
		for table, into := range map[string]func(*orderView) map[string]int{
			"reservations": func(v *orderView) map[string]int { return v.reserved },
			"fulfilments":  func(v *orderView) map[string]int { return v.sold },
		} {
			rows, err := tx.Query(ctx, `SELECT order_id, sku, sum(quantity)::int FROM `+table+` WHERE order_id = ANY($1) GROUP BY 1, 2`, ids)
			if err != nil {
				return fmt.Errorf("reading %s: %w", table, err)
			}
			if _, err := pgx.ForEachRow(rows, []any{&id, &s, &n}, func() error { into(views[id])[s] = n; return nil }); err != nil {
				return fmt.Errorf("reading %s: %w", table, err)
			}
		}
		return nil
	})
	return salesSince, err
}

// readOrdersOf reads into views what orders recorded of ids.
func (d domain) readOrdersOf(ctx context.Context, ids []string, views map[string]*orderView, salesSince pgtype.Timestamptz) error {
	var uuids []string // an id that is no order id is no order of orders
	for _, id := range ids {
		if events.ValidateOrderID(id) == nil {
			uuids = append(uuids, id)
		}
	}
	rows, err := d.orders.Query(ctx, `SELECT id::text, status, coalesce(payment, ''), lines,
			coalesce(settled_at < now() - make_interval(secs => $2), false),
			coalesce(payment_at < $3, false),
			coalesce(refund_at < now() - make_interval(secs => $2), false)
		FROM orders WHERE id = ANY($1::uuid[])`, uuids, seconds(d.grace), salesSince)
	if err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	var id, status, payment string
	var raw []byte
	var settledOld, salesBefore, refundOld bool
	_, err = pgx.ForEachRow(rows, []any{&id, &status, &payment, &raw, &settledOld, &salesBefore, &refundOld}, func() error {
		v := views[id]
		v.found, v.status, v.payment, v.lines = true, status, payment, map[string]int{}
		v.settledOld, v.salesBefore, v.refundOld = settledOld, salesBefore, refundOld
		var lines []events.Line
		if err := json.Unmarshal(raw, &lines); err != nil {
			v.unreadable = "its lines are not a list of lines: " + err.Error()
			return nil
		}
		for _, l := range lines {
			v.lines[l.SKU] += l.Quantity
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	return nil
}

// examine returns a check's examine: it reads the orders as both services
// recorded them and holds each to rule, which reports a finding with add.
func (d domain) examine(rule func(v *orderView, add func(kind, format string, args ...any))) func(context.Context, []string) ([]audit.Finding, error) {
	return func(ctx context.Context, ids []string) ([]audit.Finding, error) {
		views, err := d.readOrders(ctx, ids)
		if err != nil {
			return nil, err
		}
		var out []audit.Finding
		for _, id := range ids {
			rule(views[id], func(kind, format string, args ...any) {
				out = append(out, audit.Finding{Entity: id, Kind: kind, Detail: fmt.Sprintf(format, args...)})
			})
		}
		return out, nil
	}
}

// orderRule holds a paid order to what both services should have recorded
// of it by now. An order the scan reaches (paid longer ago than the grace
// period) and whose work is still under way is a finding of a lateness
// kind (unanswered, answer-unapplied, capture-pending, sale-missing), never
// nothing: only an open finding's order is examined again (its recheck),
// so an order let go while in flight would never be looked at again,
// whatever became of it. A wrong answer orders applied before inventory
// decided was let go so: inventory's rejection, later, disagreed with it,
// and nobody looked.
func orderRule(v *orderView, add func(kind, format string, args ...any)) {
	switch {
	case !v.found:
		return // deleted: nothing of it to hold anyone to
	case v.unreadable != "":
		add(KindUnreadable, "%s", v.unreadable)
		return
	case v.status == "paid" && v.decision == "":
		add(KindUnanswered, "paid, and inventory has not decided")
	case v.status == "paid":
		add(KindAnswerUnapplied, "inventory decided %s; orders has not applied it", v.decision)
	case v.status == "created":
		return // paid_at on an unpaid order: nothing this check can read
	case v.decision == "" && v.settledOld:
		// Inventory's decision commits before its answer is published:
		// an answer applied longer ago than the grace period had its
		// decision in inventory before inventory was read.
		add(KindAnswerWithoutDecide, "orders says %s (payment %s); inventory never decided", v.status, orNone(v.payment))
	case v.decision == "":
		// Applied within the grace period, and no decision read: the two
		// reads raced an answer, or the answer was not inventory's. Watched
		// until inventory's decision is read (the answers agree, or they
		// disagree) or the grace period passes without one.
		add(KindUnanswered, "orders says %s (payment %s); inventory has not decided", v.status, orNone(v.payment))
	case v.status != v.decision:
		add(KindAnswersDisagree, "orders says %s (payment %s); inventory decided %s", v.status, orNone(v.payment), v.decision)
	}
	want := map[string]int{}
	if v.decision == "reserved" {
		want = v.lines
	}
	if v.decision != "" && !maps.Equal(v.reserved, want) {
		add(KindWrongQuantities, "inventory %s it, reserving %s; its lines are %s", v.decision, units(v.reserved), units(v.lines))
	}
	if v.status != "reserved" || v.status != v.decision {
		return
	}
	switch v.payment {
	case "capturing":
		add(KindCapturePending, "reserved, and its capture has not ended")
	case "captured":
		switch {
		case len(v.sold) == 0 && !v.salesBefore:
			add(KindSaleMissing, "captured, and inventory has not sold its units (%s)", units(v.lines))
		case len(v.sold) > 0 && !maps.Equal(v.sold, v.lines):
			add(KindWrongSale, "captured; inventory sold %s, its lines are %s", units(v.sold), units(v.lines))
		}
	}
}

// refundRule holds a refund asked for to its end: refunded.
func refundRule(v *orderView, add func(kind, format string, args ...any)) {
	switch {
	case v.payment == "refunding" && v.refundOld:
		add(KindRefundPending, "its refund was asked for and has not ended")
	case v.payment == "refund_failed":
		add(KindRefundFailed, "the provider refused its refund for good: the customer is still charged")
	}
}

// decisionRule holds a decision to a paid order.
func decisionRule(v *orderView, add func(kind, format string, args ...any)) {
	switch {
	case v.decision == "":
		// no decision (gone): nothing to hold to a cause
	case !v.found:
		add(KindDecisionWithoutOrder, "inventory %s an order orders does not have (reserving %s)", v.decision, units(v.reserved))
	case v.status == "created":
		add(KindDecisionWithoutPayment, "inventory %s an order that was never paid (reserving %s)", v.decision, units(v.reserved))
	}
}

// saleRule holds a sale to a captured payment.
func saleRule(v *orderView, add func(kind, format string, args ...any)) {
	if len(v.sold) > 0 && v.payment != "captured" {
		add(KindSaleWithoutCapture, "inventory sold %s; orders' payment is %s (order %s)", units(v.sold), orNone(v.payment), orNone(v.status))
	}
}

// salesCheck holds each sale to a captured payment. It reads fulfilments
// past the watermark by (created_at, id) (index fulfilments_created; mark
// key: the last fulfilment's id) up to the horizon, and examines their
// orders.
func (d domain) salesCheck() audit.Check {
	examine := d.examine(saleRule)
	return audit.Check{
		Name: "sales",
		Scan: func(ctx context.Context, _ pgx.Tx, from audit.Mark, grace time.Duration, limit int) (audit.Batch, error) {
			after, _ := strconv.ParseInt(from.Key, 10, 64)
			rows, err := d.inventory.Query(ctx, `SELECT id, order_id, created_at FROM fulfilments
				WHERE (created_at, id) > ($1, $2) AND created_at < `+horizon(3)+`
				ORDER BY created_at, id LIMIT $4`, since(from.Time), after, seconds(grace), limit)
			if err != nil {
				return audit.Batch{Next: from}, fmt.Errorf("listing sales: %w", err)
			}
			b := audit.Batch{Next: from}
			ids := map[string]bool{}
			var id int64
			var order string
			var at time.Time
			if _, err := pgx.ForEachRow(rows, []any{&id, &order, &at}, func() error {
				b.Examined++
				ids[order] = true
				b.Next = audit.Mark{Time: at, Key: strconv.FormatInt(id, 10)}
				return nil
			}); err != nil {
				return audit.Batch{Next: from}, fmt.Errorf("listing sales: %w", err)
			}
			if len(ids) == 0 {
				return b, nil
			}
			b.Findings, err = examine(ctx, slices.Sorted(maps.Keys(ids)))
			return b, err
		},
		Recheck: func(ctx context.Context, _ pgx.Tx, _ audit.Mark, entities []string) ([]audit.Finding, error) {
			return examine(ctx, entities)
		},
	}
}

// snapshot runs f in one read-only repeatable-read transaction of pool.
func snapshot(ctx context.Context, pool *pgxpool.Pool, f func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, f)
}

// since is a watermark's time as a keyset bound: the zero Mark (nothing
// examined yet) is before every time there is. A bound that is never NULL
// keeps the statement's generic plan an index range scan.
func since(t time.Time) time.Time {
	if t.IsZero() {
		return time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return t
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// units writes units per SKU as "A×2, B×1", by SKU.
func units(m map[string]int) string {
	if len(m) == 0 {
		return "nothing"
	}
	parts := make([]string, 0, len(m))
	for _, sku := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s×%d", sku, m[sku]))
	}
	return strings.Join(parts, ", ")
}
