package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Service describes the orders service to the platform.
func Service() platform.Service {
	migrations, _ := fs.Sub(migrationFiles, "migrations")
	return platform.Service{
		Name:       "orders",
		Migrations: migrations,
		Topic:      events.TopicInventory,
		Envelope:   events.RecordEnvelope,
		Apply: func(cfg platform.Config) inbox.BatchFunc {
			return settler{unguarded: cfg.DomainGuardDisabled}.apply
		},
		Routes:  routes,
		Effects: payments, // payment.go, refund.go
	}
}

// Order is the API's view of an order.
type Order struct {
	ID           string        `json:"id"`
	Status       string        `json:"status"`
	Lines        []events.Line `json:"lines"`
	Amount       int64         `json:"amount"` // cents, in events.Currency
	RejectReason string        `json:"reject_reason,omitempty"`
	// Payment is the capture's state once the order is reserved:
	// capturing, captured, declined or failed (payment.go); then, for a
	// captured payment given back, refunding, refunded or refund_failed
	// (refund.go).
	Payment      string `json:"payment,omitempty"`
	CaptureID    string `json:"capture_id,omitempty"`
	RefundID     string `json:"refund_id,omitempty"`
	PaymentError string `json:"payment_error,omitempty"`
	// CaptureAttempts counts the captures asked for: 1, and one more for
	// each retry a person made after a decline.
	CaptureAttempts int `json:"capture_attempts,omitempty"`
}

var errNotFound = errors.New("order not found")

func createOrder(ctx context.Context, db platform.DB, lines []events.Line, card string) (Order, error) {
	o := Order{ID: uuid.Must(uuid.NewV7()).String(), Status: "created", Lines: lines, Amount: events.Amount(lines)}
	err := db.Write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, lines, amount, card) VALUES ($1, $2, $3, $4)`, o.ID, lines, o.Amount, card)
		return err
	})
	if err != nil {
		return Order{}, fmt.Errorf("creating order: %w", err)
	}
	return o, nil
}

// payment is the outcome of paying one order.
type payment struct {
	order Order
	err   error // errNotFound
}

// payOrders pays a batch of orders in one transaction: each created order
// moves to paid and gets its OrderPaid in the outbox, committed together.
// Paying an order that is already paid (a double submit, a client retrying
// after a lost response) changes nothing and publishes nothing: the status
// transition is the idempotency key. The statements are set-based, so a
// batch costs the same few statements however many orders it holds.
func payOrders(ctx context.Context, db platform.DB, ids []string) ([]payment, error) {
	res := make([]payment, len(ids))
	canonical := make([]string, len(ids)) // as Postgres prints them
	var valid []string
	for i, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil {
			res[i].err = errNotFound
			continue
		}
		canonical[i] = u.String()
		valid = append(valid, canonical[i])
	}
	orders := map[string]Order{}
	err := db.Write(ctx, func(tx pgx.Tx) error { // answered once its standbys hold it
		rows, err := tx.Query(ctx, `
			UPDATE orders SET status = 'paid', paid_at = now()
			WHERE id = ANY($1::uuid[]) AND status = 'created'
			RETURNING id::text, lines, coalesce(amount, 0), paid_at`, platform.PlanEachTime, valid)
		if err != nil {
			return fmt.Errorf("paying orders: %w", err)
		}
		var msgs []*message.Message
		var id string
		var lines []events.Line
		var amount int64
		var paidAt time.Time
		if _, err := pgx.ForEachRow(rows, []any{&id, &lines, &amount, &paidAt}, func() error {
			msg, err := events.Message(events.OrderPaid{
				Envelope: events.NewEnvelope(events.TypeOrderPaid, id), Lines: lines, PaidAt: paidAt,
			})
			msgs = append(msgs, msg)
			orders[id] = Order{ID: id, Status: "paid", Lines: lines, Amount: amount}
			lines = nil // the next row decodes into a new slice
			return err
		}); err != nil {
			return fmt.Errorf("paying orders: %w", err)
		}
		if err := outbox.PublishTx(ctx, tx, events.TopicOrders, msgs...); err != nil {
			return err
		}
		if len(orders) == len(valid) {
			return nil
		}
		// The others were paid before, or do not exist.
		return readOrders(ctx, tx, valid, orders)
	})
	if err != nil {
		return nil, err
	}
	for i, id := range canonical {
		if res[i].err != nil {
			continue
		}
		o, ok := orders[id]
		if !ok {
			res[i].err = fmt.Errorf("%w: %s", errNotFound, id)
		}
		res[i].order = o
	}
	return res, nil
}

// readOrders adds to orders those of ids it does not hold yet.
func readOrders(ctx context.Context, tx pgx.Tx, ids []string, orders map[string]Order) error {
	rows, err := tx.Query(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = ANY($1::uuid[])`, platform.PlanEachTime, ids)
	if err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanOrder)
	if err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	for _, o := range list {
		if _, ok := orders[o.ID]; !ok {
			orders[o.ID] = o
		}
	}
	return nil
}

// orderColumns are the columns scanOrder reads.
const orderColumns = `id::text, status, lines, coalesce(amount, 0), coalesce(reject_reason, ''),
	coalesce(payment, ''), coalesce(capture_id, ''), coalesce(refund_id, ''), coalesce(payment_error, ''),
	CASE WHEN payment IS NULL THEN 0 ELSE capture_attempt END`

func scanOrder(row pgx.CollectableRow) (Order, error) {
	var o Order
	err := row.Scan(&o.ID, &o.Status, &o.Lines, &o.Amount, &o.RejectReason, &o.Payment, &o.CaptureID, &o.RefundID, &o.PaymentError, &o.CaptureAttempts)
	return o, err
}

func getOrder(ctx context.Context, pool *pgxpool.Pool, id string) (Order, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Order{}, errNotFound
	}
	id = u.String() // any spelling uuid.Parse takes (braces, urn:uuid:, upper case), as Postgres prints it
	var o Order
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
		o, err = readOrder(ctx, tx, id)
		return err
	})
	return o, err
}

func readOrder(ctx context.Context, tx pgx.Tx, id string) (Order, error) {
	rows, err := tx.Query(ctx, `SELECT `+orderColumns+` FROM orders WHERE id = $1`, platform.PlanEachTime, id)
	if err != nil {
		return Order{}, fmt.Errorf("reading order: %w", err)
	}
	o, err := pgx.CollectExactlyOneRow(rows, scanOrder)
	if errors.Is(err, pgx.ErrNoRows) {
		return Order{}, fmt.Errorf("%w: %s", errNotFound, id)
	}
	if err != nil {
		return Order{}, fmt.Errorf("reading order: %w", err)
	}
	return o, nil
}

// countByStatus counts the orders by column (status or payment), a
// constant of this file.
func countByStatus(ctx context.Context, pool *pgxpool.Pool, column string) (map[string]int, error) {
	rows, err := pool.Query(ctx, `SELECT `+column+`, count(*) FROM orders WHERE `+column+` IS NOT NULL GROUP BY 1`)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		counts[s] = n
	}
	return counts, rows.Err()
}

// settler applies inventory's answers (see apply).
type settler struct {
	// unguarded switches the domain guard off (DOMAIN_GUARD_DISABLED): only
	// the chaos harness's second control run does.
	unguarded bool
}

// settleOrders is the guarded settler's apply.
var settleOrders = settler{}.apply

// apply applies a batch of InventoryReserved and InventoryRejected events
// to their orders, in the inbox's transaction (the inbox hands it every
// delivery that arrived together; see pkg/inbox Handler). Every answer
// applied is recorded in order_events.
//
// The domain guard: an order takes one answer, and only while it is paid.
// An answer for an order already settled (earlier, or earlier in this batch)
// is refused with its reason in refusals, not applied; an
// InventoryReserved whose lines are not the order's, or an answer for an
// order that does not exist or was never paid, is a permanent error (dead-
// lettered: no redelivery explains it). Unguarded, every answer is recorded
// as applied and the first one settles the order, as before the guard.
func (s settler) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	answers, err := readAnswers(msgs)
	if err != nil {
		return err
	}
	settled, err := settle(ctx, tx, answers)
	if err != nil {
		return err
	}
	return s.record(ctx, tx, answers, settled)
}

// stockAnswer is one of inventory's answers: reserved, with the lines it
// reserved, or rejected, with why.
type stockAnswer struct {
	orderID, event, msgID, status string
	reason                        *string
	lines                         []events.Line // InventoryReserved's
}

// readAnswers decodes msgs; a message that is not one of inventory's
// answers is a permanent error.
func readAnswers(msgs []*message.Message) ([]stockAnswer, error) {
	answers := make([]stockAnswer, len(msgs))
	for i, msg := range msgs {
		ev, err := events.DecodeMessage(msg)
		if err != nil {
			return nil, inbox.Permanent(err)
		}
		a := stockAnswer{msgID: msg.UUID}
		switch e := ev.(type) {
		case *events.InventoryReserved:
			a.orderID, a.status, a.event, a.lines = e.OrderID, "reserved", e.Type, e.Lines
		case *events.InventoryRejected:
			a.orderID, a.status, a.event, a.reason = e.OrderID, "rejected", e.Type, &e.Reason
		default:
			return nil, inbox.Permanent(fmt.Errorf("orders does not consume %s", events.TypeOf(ev)))
		}
		answers[i] = a
	}
	return answers, nil
}

// settle settles each paid order by its first answer in the batch, asks
// for the captures of the reserved ones (payment.go), and returns the
// orders it settled with their lines. An answer for an order not there or
// never paid is a permanent error (checkUnsettled).
func settle(ctx context.Context, tx pgx.Tx, answers []stockAnswer) (map[string][]events.Line, error) {
	var ids, statuses []string // the first answer per order settles it
	var reasons []*string
	first := map[string]bool{}
	for _, a := range answers {
		if !first[a.orderID] {
			first[a.orderID] = true
			ids, statuses, reasons = append(ids, a.orderID), append(statuses, a.status), append(reasons, a.reason)
		}
	}
	rows, err := tx.Query(ctx, `
		UPDATE orders o SET status = u.status, reject_reason = u.reason, settled_at = now(),
			payment = CASE WHEN u.status = 'reserved' THEN 'capturing' END
		FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, status, reason)
		WHERE o.id = u.id AND o.id = ANY($1) AND o.status = 'paid'
		RETURNING o.id::text, o.status, o.lines, coalesce(o.amount, 0), o.card`,
		platform.PlanEachTime, ids, statuses, reasons)
	if err != nil {
		return nil, fmt.Errorf("settling orders: %w", err)
	}
	settled := map[string][]events.Line{} // the orders this batch settled, with their lines
	var reserved []capture                // and the captures the reserved ones ask for
	var id, status, card string
	var lines []events.Line
	var amount int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &lines, &amount, &card}, func() error {
		settled[id] = lines
		if status == "reserved" {
			if amount == 0 { // an order created before its amount was recorded
				amount = events.Amount(lines)
			}
			reserved = append(reserved, capture{OrderID: id, Amount: amount, Currency: events.Currency, Card: card})
		}
		lines = nil
		return nil
	}); err != nil {
		return nil, fmt.Errorf("settling orders: %w", err)
	}
	if err := enqueueCaptures(ctx, tx, reserved); err != nil { // payment.go
		return nil, err
	}
	if len(settled) < len(ids) {
		if err := checkUnsettled(ctx, tx, ids, settled); err != nil {
			return nil, err
		}
	}
	return settled, nil
}

// record writes each answer to order_events, or, refused by the domain
// guard (its order settled already), to refusals with why. An
// InventoryReserved whose lines are not its order's is a permanent error.
func (s settler) record(ctx context.Context, tx pgx.Tx, answers []stockAnswer, settled map[string][]events.Line) error {
	var evOrder, evName, evMsg []string
	var refOrder, refMsg, refWhy []string
	taken := map[string]string{} // order → the message that settled it in this batch
	for _, a := range answers {
		orderLines, settledHere := settled[a.orderID]
		switch {
		case s.unguarded:
		case settledHere && taken[a.orderID] == "":
			taken[a.orderID] = a.msgID
			if a.lines != nil && !sameLines(a.lines, orderLines) {
				return inbox.Permanent(fmt.Errorf("%s for order %s reserves %v, but the order holds %v", a.event, a.orderID, a.lines, orderLines))
			}
		case settledHere:
			refOrder, refMsg, refWhy = append(refOrder, a.orderID), append(refMsg, a.msgID), append(refWhy,
				fmt.Sprintf("order already settled by message %s in the same batch; %s refused", taken[a.orderID], a.event))
			continue
		default:
			refOrder, refMsg, refWhy = append(refOrder, a.orderID), append(refMsg, a.msgID), append(refWhy,
				fmt.Sprintf("order already settled; %s refused", a.event))
			continue
		}
		evOrder, evName, evMsg = append(evOrder, a.orderID), append(evName, a.event), append(evMsg, a.msgID)
	}
	if len(evOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO order_events (order_id, event, message_id)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])`, evOrder, evName, evMsg); err != nil {
			return fmt.Errorf("recording events: %w", err)
		}
	}
	if len(refOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO refusals (order_id, message_id, reason)
			SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])`, refOrder, refMsg, refWhy); err != nil {
			return fmt.Errorf("recording refusals: %w", err)
		}
	}
	return nil
}

// sameLines reports whether a and b hold the same quantity of every SKU.
func sameLines(a, b []events.Line) bool {
	sum := func(lines []events.Line) map[string]int {
		m := map[string]int{}
		for _, l := range lines {
			m[l.SKU] += l.Quantity
		}
		return m
	}
	return maps.Equal(sum(a), sum(b))
}

// checkUnsettled looks at the orders an answer did not settle. One already
// settled got a second answer, which the caller refuses (or, unguarded,
// records); an answer for an order that does not exist, or was never paid,
// is a permanent error.
func checkUnsettled(ctx context.Context, tx pgx.Tx, orderIDs []string, settled map[string][]events.Line) error {
	rows, err := tx.Query(ctx, `SELECT id::text, status FROM orders WHERE id = ANY($1::uuid[])`, platform.PlanEachTime, orderIDs)
	if err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	current := map[string]string{}
	var id, status string
	if _, err := pgx.ForEachRow(rows, []any{&id, &status}, func() error { current[id] = status; return nil }); err != nil {
		return fmt.Errorf("reading orders: %w", err)
	}
	for _, orderID := range orderIDs {
		if _, ok := settled[orderID]; ok {
			continue
		}
		switch current[orderID] {
		case "":
			return inbox.Permanent(fmt.Errorf("an answer for order %s, which does not exist", orderID))
		case "created":
			return inbox.Permanent(fmt.Errorf("an answer for order %s, which was never paid", orderID))
		}
	}
	return nil
}
