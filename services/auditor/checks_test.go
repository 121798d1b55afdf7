package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// world is the two services' databases, written here as the services
// would (or as a bug would), and the auditor's.
type world struct {
	t                        testing.TB
	orders, inventory, state *pgxpool.Pool
}

func newWorld(t testing.TB) *world {
	t.Helper()
	w := &world{t: t, orders: database(t), inventory: database(t), state: database(t)}
	ctx := t.Context()
	require.NoError(t, migrate.Apply(ctx, w.orders, "orders", os.DirFS("../orders/migrations")))
	require.NoError(t, migrate.Apply(ctx, w.inventory, "inventory", os.DirFS("../inventory/migrations")))
	require.NoError(t, migrateState(ctx, w.state))
	w.exec(w.inventory, `INSERT INTO stock (sku, available) VALUES ('A', 100), ('B', 100), ('C', 100)`)
	// Inventory learnt to sell (its migration 004) long before these orders.
	w.exec(w.inventory, `UPDATE schema_migrations SET applied_at = now() - interval '1 day' WHERE component = 'inventory'`)
	return w
}

// database creates an empty database for t (a test or a benchmark).
func database(t testing.TB) *pgxpool.Pool {
	t.Helper()
	name := "auditor_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	url, err := pg.CreateDatabase(t.Context(), name)
	require.NoError(t, err)
	pg.DropWhenDone(t, name)
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func (w *world) exec(p *pgxpool.Pool, sql string, args ...any) {
	w.t.Helper()
	_, err := p.Exec(w.t.Context(), sql, args...)
	require.NoError(w.t, err, sql)
}

// order is one order's story: what orders recorded (status, payment) and
// what inventory did (decision, reserved, sold).
type order struct {
	status, payment string
	lines           map[string]int
	decision        string
	reserved, sold  map[string]int
	age             time.Duration // since it was paid; defaults to an hour
}

// add writes o as the services would have (stock moved with each row) and
// returns its id.
func (w *world) add(o order) string {
	w.t.Helper()
	id := uuid.NewString()
	if o.age == 0 {
		o.age = time.Hour
	}
	ago := fmt.Sprintf("%d seconds", int(o.age.Seconds()))
	var lines []events.Line
	for _, sku := range sortedSKUs(o.lines) {
		lines = append(lines, events.Line{SKU: sku, Quantity: o.lines[sku]})
	}
	js, err := json.Marshal(lines)
	require.NoError(w.t, err)
	var payment *string
	if o.payment != "" {
		payment = &o.payment
	}
	w.exec(w.orders, `INSERT INTO orders (id, status, lines, payment, paid_at, created_at, settled_at, payment_at, refund_at)
		VALUES ($1, $2, $3, $4, CASE WHEN $2 <> 'created' THEN now() - $5::interval END, now() - $5::interval - interval '1 minute',
			CASE WHEN $2 IN ('reserved', 'rejected') THEN now() - $5::interval END,
			CASE WHEN $4 <> 'capturing' THEN now() - $5::interval END,
			CASE WHEN $4 LIKE 'refund%' THEN now() - $5::interval END)`,
		id, o.status, js, payment, ago)
	w.decide(id, o.decision, ago)
	w.rows("reservations", id, o.reserved, ago)
	w.rows("fulfilments", id, o.sold, ago)
	return id
}

func (w *world) decide(id, decision, ago string) {
	w.t.Helper()
	if decision != "" {
		w.exec(w.inventory, `INSERT INTO decisions (order_id, decision, message_id, decided_at) VALUES ($1, $2, 'm', now() - $3::interval)`, id, decision, ago)
	}
}

// rows writes reservation or fulfilment rows and moves the stock as
// inventory does.
func (w *world) rows(table, id string, units map[string]int, ago string) {
	w.t.Helper()
	for _, sku := range sortedSKUs(units) {
		w.exec(w.inventory, `INSERT INTO `+table+` (order_id, sku, quantity, message_id, created_at) VALUES ($1, $2, $3, 'm', now() - $4::interval)`, id, sku, units[sku], ago)
		if table == "reservations" {
			w.exec(w.inventory, `UPDATE stock SET available = available - $2, reserved = reserved + $2 WHERE sku = $1`, sku, units[sku])
		} else {
			w.exec(w.inventory, `UPDATE stock SET reserved = reserved - $2, sold = sold + $2 WHERE sku = $1`, sku, units[sku])
		}
	}
}

func sortedSKUs(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (w *world) auditor(grace time.Duration) *audit.Auditor {
	w.t.Helper()
	a, err := audit.New(w.state, audit.Config{Grace: grace, Batch: 3}, domain{orders: w.orders, inventory: w.inventory, grace: grace}.checks()...)
	require.NoError(w.t, err)
	return a
}

// round runs one round and returns the open findings as "check entity kind".
func (w *world) round(a *audit.Auditor) []string {
	w.t.Helper()
	_, err := a.Round(w.t.Context())
	require.NoError(w.t, err)
	return w.open()
}

func (w *world) open() []string { return w.findings(false) }

// ever lists every finding ever raised, resolved ones too: a false alarm
// that a recheck resolved in the same round was still raised.
func (w *world) ever() []string { return w.findings(true) }

func (w *world) findings(all bool) []string {
	w.t.Helper()
	recs, err := audit.ListFindings(w.t.Context(), w.state, audit.ListOptions{All: all, Limit: 1000})
	require.NoError(w.t, err)
	out := []string{}
	for _, r := range recs {
		out = append(out, r.Check+" "+r.Entity+" "+r.Kind)
	}
	sort.Strings(out)
	return out
}

func sorted(s ...string) []string {
	out := append([]string{}, s...)
	sort.Strings(out)
	return out
}

var (
	a2b1 = map[string]int{"A": 2, "B": 1}
	c1   = map[string]int{"C": 1}
)

// healthy adds one order of each good ending: sold, rejected, declined,
// refunded (captured, then given back when inventory's rejection came
// to light).
func (w *world) healthy() {
	w.t.Helper()
	w.add(order{status: "rejected", payment: "refunded", lines: c1, decision: "rejected"})
	w.add(order{status: "reserved", payment: "captured", lines: a2b1, decision: "reserved", reserved: a2b1, sold: a2b1})
	w.add(order{status: "rejected", lines: c1, decision: "rejected"})
	w.add(order{status: "reserved", payment: "declined", lines: c1, decision: "reserved", reserved: c1})
	w.add(order{status: "created", lines: c1})
}

// TestCleanHistoryHasNoFinding: orders that ended well, however many
// rounds, raise nothing, and a round past the watermark reads nothing.
func TestCleanHistoryHasNoFinding(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for range 3 {
		w.healthy()
	}
	a := w.auditor(time.Minute)
	w.round(a)
	require.Empty(t, w.ever())
	r, err := a.Round(t.Context())
	require.NoError(t, err)
	for _, c := range r.Checks {
		require.Zero(t, c.Examined, c.Check)
		require.True(t, c.CaughtUp, c.Check)
	}
	st, err := audit.ReadStatus(t.Context(), w.state)
	require.NoError(t, err)
	examined := map[string]int64{}
	for _, s := range st {
		examined[s.Check] = s.Examined
	}
	// 12 paid orders, 12 decisions, 3 sales (of two SKUs each: 6 rows),
	// 3 refunds, 9 reservation rows (A and B of the sold, C of the
	// declined) and 6 fulfilment rows.
	require.Equal(t, map[string]int64{"orders": 12, "decisions": 12, "refunds": 3, "sales": 6, "stock": 15}, examined)
}

// TestEachBreachIsFound: one order per kind of breach, beside healthy
// ones: each is found, named by its order (or SKU) and kind, and nothing
// else is.
func TestEachBreachIsFound(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.healthy()
	want := []string{}
	breach := func(check, kind string, o order) string {
		id := w.add(o)
		want = append(want, check+" "+id+" "+kind)
		return id
	}
	unanswered := breach("orders", KindUnanswered, order{status: "paid", lines: c1})
	breach("orders", KindAnswerUnapplied, order{status: "paid", lines: c1, decision: "rejected"})
	// A well-formed but wrong answer: orders reserved and captured an order
	// inventory rejected.
	breach("orders", KindAnswersDisagree, order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	breach("orders", KindAnswerWithoutDecide, order{status: "rejected", lines: c1})
	breach("orders", KindWrongQuantities, order{status: "reserved", payment: "declined", lines: a2b1, decision: "reserved", reserved: map[string]int{"A": 2}})
	// Applied twice with the domain guard off: no decision row, the
	// reservation's rows say what inventory did.
	breach("orders", KindWrongQuantities, order{status: "reserved", payment: "declined", lines: c1, reserved: map[string]int{"C": 2}})
	breach("orders", KindCapturePending, order{status: "reserved", payment: "capturing", lines: c1, decision: "reserved", reserved: c1})
	breach("orders", KindSaleMissing, order{status: "reserved", payment: "captured", lines: c1, decision: "reserved", reserved: c1})
	breach("orders", KindWrongSale, order{status: "reserved", payment: "captured", lines: c1, decision: "reserved", reserved: c1, sold: map[string]int{"C": 2}})
	// Sold and never captured: the sale's check sees it.
	breach("refunds", KindRefundPending, order{status: "rejected", payment: "refunding", lines: c1, decision: "rejected"})
	breach("refunds", KindRefundFailed, order{status: "rejected", payment: "refund_failed", lines: c1, decision: "rejected"})
	breach("sales", KindSaleWithoutCapture, order{status: "reserved", payment: "declined", lines: c1, decision: "reserved", reserved: c1, sold: c1})
	// Inventory decided an order orders never had, and one never paid.
	ghost := "not-a-uuid"
	w.decide(ghost, "reserved", "3600 seconds")
	w.rows("reservations", ghost, c1, "3600 seconds")
	want = append(want, "decisions "+ghost+" "+KindDecisionWithoutOrder)
	unknown := uuid.NewString()
	w.decide(unknown, "rejected", "3600 seconds")
	want = append(want, "decisions "+unknown+" "+KindDecisionWithoutOrder)
	breach("decisions", KindDecisionWithoutPayment, order{status: "created", lines: c1, decision: "rejected"})
	// A stock row moved by nothing in its history.
	w.exec(w.inventory, `UPDATE stock SET reserved = reserved + 1, available = available - 1 WHERE sku = 'B'`)
	want = append(want, "stock B "+KindStockOutOfBalance)

	a := w.auditor(time.Minute)
	require.Equal(t, sorted(want...), w.round(a))

	// The late answer arrives: its finding resolves; the rest hold.
	w.decide(unanswered, "rejected", "1 second")
	w.exec(w.orders, `UPDATE orders SET status = 'rejected' WHERE id = $1`, unanswered)
	want = want[1:]
	require.Equal(t, sorted(want...), w.round(a))
	recs, err := audit.ListFindings(t.Context(), w.state, audit.ListOptions{All: true, Check: "orders", Limit: 100})
	require.NoError(t, err)
	for _, r := range recs {
		if r.Entity == unanswered {
			require.False(t, r.Open())
			require.Equal(t, "paid, and inventory has not decided", r.Detail)
		}
	}
	// The stock put right.
	w.exec(w.inventory, `UPDATE stock SET reserved = reserved - 1, available = available + 1 WHERE sku = 'B'`)
	require.NotContains(t, w.round(a), "stock B "+KindStockOutOfBalance)
}

// TestGraceLeavesOrdersInFlight: an order paid a moment ago, not yet
// answered, is no finding; its sale, its decision and its stock rows
// count in the balance without a finding.
func TestGraceLeavesOrdersInFlight(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.healthy()
	w.add(order{status: "paid", lines: c1, age: time.Second})
	w.add(order{status: "reserved", payment: "captured", lines: a2b1, decision: "reserved", reserved: a2b1, sold: a2b1, age: time.Second})
	a := w.auditor(time.Minute)
	w.round(a)
	require.Empty(t, w.ever())
	// The ledger holds the settled rows only (the healthy order's A×2,
	// reserved and sold): the recent ones are added at each comparison,
	// not counted in full.
	var res, ful int64
	require.NoError(t, w.state.QueryRow(t.Context(), `SELECT reservations, fulfilments FROM audit_stock_ledger WHERE sku = 'A'`).Scan(&res, &ful))
	require.Equal(t, []int64{2, 2}, []int64{res, ful})
	// In flight, the stock row is still balanced against its recent rows:
	// a stock row wrong by a unit whose rows are all recent is found.
	w.exec(w.inventory, `UPDATE stock SET sold = sold + 1 WHERE sku = 'A'`)
	require.Equal(t, []string{"stock A " + KindStockOutOfBalance}, w.round(a))
}

// TestLedgerCorrectsItself: a ledger that missed a row (its transaction
// outlived the grace period) or counted one twice is corrected from a
// full count, not reported; a stock row that disagrees with its whole
// history is.
func TestLedgerCorrectsItself(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	for range 4 {
		w.healthy()
	}
	a := w.auditor(time.Minute)
	w.round(a)
	require.Empty(t, w.ever())
	w.exec(w.state, `UPDATE audit_stock_ledger SET reservations = reservations + 5, fulfilments = fulfilments - 1 WHERE sku = 'A'`)
	// A reservation committed late: its id is behind the watermark.
	w.exec(w.inventory, `INSERT INTO reservations (id, order_id, sku, quantity, message_id, created_at)
		OVERRIDING SYSTEM VALUE VALUES (0, 'late', 'C', 3, 'm', now() - interval '1 hour')`)
	w.exec(w.inventory, `UPDATE stock SET reserved = reserved + 3, available = available - 3 WHERE sku = 'C'`)
	w.round(a)
	require.Empty(t, w.ever(), "the ledger is corrected, nothing found")
	var res, ful int64
	require.NoError(t, w.state.QueryRow(t.Context(), `SELECT reservations, fulfilments FROM audit_stock_ledger WHERE sku = 'A'`).Scan(&res, &ful))
	require.Equal(t, []int64{8, 8}, []int64{res, ful}, "4 sold orders of A×2")
	require.NoError(t, w.state.QueryRow(t.Context(), `SELECT reservations FROM audit_stock_ledger WHERE sku = 'C'`).Scan(&res))
	require.EqualValues(t, 4+3, res, "C: the four declined orders' C×1, and the late row's 3")
}

// TestLateCommitIsNotSkipped: an order paid in a transaction that commits
// after another payment that started later: the watermark must not pass
// the later one while the first is open (its paid_at is its transaction's
// start), or the first is never examined.
func TestLateCommitIsNotSkipped(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	late := w.add(order{status: "created", lines: c1})
	early := w.add(order{status: "created", lines: c1})
	a := w.auditor(time.Nanosecond) // every committed order is settled at once
	tx, err := w.orders.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, `UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1`, late)
	require.NoError(t, err)
	w.exec(w.orders, `UPDATE orders SET status = 'paid', paid_at = now() WHERE id = $1`, early)
	w.round(a)
	require.NoError(t, tx.Commit(ctx))
	w.round(a)
	require.Equal(t, sorted("orders "+late+" "+KindUnanswered, "orders "+early+" "+KindUnanswered), w.ever())
}

// TestLateSaleIsNotSkipped: the same for a sale: one committed late, after
// a sale with a later id, is still examined.
func TestLateSaleIsNotSkipped(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	declined := w.add(order{status: "reserved", payment: "declined", lines: c1, decision: "reserved", reserved: c1})
	captured := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "reserved", reserved: c1})
	a := w.auditor(time.Nanosecond)
	tx, err := w.inventory.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, `INSERT INTO fulfilments (order_id, sku, quantity, message_id) VALUES ($1, 'C', 1, 'm')`, declined)
	require.NoError(t, err)
	w.exec(w.inventory, `INSERT INTO fulfilments (order_id, sku, quantity, message_id) VALUES ($1, 'C', 1, 'm')`, captured)
	w.round(a)
	require.NoError(t, tx.Commit(ctx))
	w.round(a)
	require.Contains(t, w.ever(), "sales "+declined+" "+KindSaleWithoutCapture)
}

// TestHostileRowsDoNotStopACheck: an order id in another spelling of a
// UUID (which Postgres's uuid type refuses, or reads as another order's),
// or an order whose lines are not lines, is a finding of its own; the
// checks go on past it.
func TestHostileRowsDoNotStopACheck(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.healthy()
	var want []string
	for _, id := range []string{"urn:uuid:" + uuid.NewString(), "{" + uuid.NewString() + "}", strings.ToUpper(uuid.NewString()),
		strings.ReplaceAll(uuid.NewString(), "-", ""), "<b>x</b>", ""} {
		w.decide(id, "rejected", "3600 seconds")
		want = append(want, "decisions "+id+" "+KindDecisionWithoutOrder)
	}
	bad := w.add(order{status: "rejected", lines: c1, decision: "rejected"})
	w.exec(w.orders, `UPDATE orders SET lines = '{"sku": "C"}' WHERE id = $1`, bad)
	want = append(want, "orders "+bad+" "+KindUnreadable)
	a := w.auditor(time.Minute)
	r, err := a.Round(t.Context())
	require.NoError(t, err)
	for _, c := range r.Checks {
		require.True(t, c.CaughtUp, c.Check)
	}
	require.Equal(t, sorted(want...), w.ever())
}

// TestLateOrdersStayWatched: an order the scan reaches while its work is
// under way is a finding at each stage it is found at, a lateness kind
// resolved once that stage ends, and examined again until its last stage
// ends: an order let go in flight is never looked at again. So a wrong
// answer orders applied before inventory decided (within the grace
// period) is watched until inventory's rejection disagrees with it, and a
// capture whose sale never comes stays a finding.
func TestLateOrdersStayWatched(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	id := w.add(order{status: "paid", lines: c1})
	a := w.auditor(time.Minute)
	require.Equal(t, []string{"orders " + id + " " + KindUnanswered}, w.round(a))
	w.decide(id, "reserved", "1 second")
	w.rows("reservations", id, c1, "1 second")
	require.Equal(t, []string{"orders " + id + " " + KindAnswerUnapplied}, w.round(a), "decided, not applied yet")
	w.exec(w.orders, `UPDATE orders SET status = 'reserved', payment = 'capturing', settled_at = now() WHERE id = $1`, id)
	require.Equal(t, []string{"orders " + id + " " + KindCapturePending}, w.round(a), "answered, not captured yet")
	w.exec(w.orders, `UPDATE orders SET payment = 'captured', payment_at = now() WHERE id = $1`, id)
	require.Equal(t, []string{"orders " + id + " " + KindSaleMissing}, w.round(a), "captured, not sold yet")
	w.rows("fulfilments", id, c1, "0 seconds")
	require.Empty(t, w.round(a), "sold: its work has ended")
	require.Equal(t, sorted("orders "+id+" "+KindUnanswered, "orders "+id+" "+KindAnswerUnapplied, "orders "+id+" "+KindCapturePending,
		"orders "+id+" "+KindSaleMissing), w.ever(), "each stage it was late at, each resolved")

	// A wrong answer, signed as inventory's, applied while inventory is
	// behind: reserved and captured a moment ago, nothing decided.
	wrong := w.add(order{status: "paid", lines: c1})
	w.exec(w.orders, `UPDATE orders SET status = 'reserved', payment = 'captured', settled_at = now(), payment_at = now() WHERE id = $1`, wrong)
	require.Contains(t, w.round(a), "orders "+wrong+" "+KindUnanswered, "applied an answer inventory has not given")
	w.decide(wrong, "rejected", "0 seconds")
	require.Equal(t, []string{"orders " + wrong + " " + KindAnswersDisagree}, w.round(a), "inventory, behind, rejects it")
}

// TestCapturesBeforeSalesExpectNoSale: an order captured before inventory
// learnt to sell (its migration 004, which says so) never had an
// OrderCaptured: its missing sale is not a finding.
func TestCapturesBeforeSalesExpectNoSale(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.exec(w.inventory, `UPDATE schema_migrations SET applied_at = now() - interval '30 minutes' WHERE component = 'inventory' AND version = 4`)
	old := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "reserved", reserved: c1})                           // captured an hour ago
	recent := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "reserved", reserved: c1, age: 10 * time.Minute}) // after
	a := w.auditor(time.Minute)
	require.Equal(t, []string{"orders " + recent + " " + KindSaleMissing}, w.round(a), "not %s", old)
}
