package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Service describes the inventory service to the platform.
func Service() platform.Service {
	migrations, _ := fs.Sub(migrationFiles, "migrations")
	return platform.Service{
		Name:       "inventory",
		Migrations: migrations,
		Topic:      events.TopicOrders,
		Envelope:   events.RecordEnvelope,
		Apply: func(cfg platform.Config) inbox.BatchFunc {
			return reserver{unguarded: cfg.DomainGuardDisabled}.apply
		},
		Routes: routes,
	}
}

// maxAvailable bounds the stock of one SKU set through the API: available is
// an int column and only falls from what was set. reserved holds the units
// of open orders, and sold grows over every restock: both are bigints
// (migrations 003 and 004).
const maxAvailable = 1 << 30

// StockLevel is one item of PUT /stock: what is available of a SKU. The
// reserved units are inventory's to count, never a client's to set.
type StockLevel struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

// Stock is the API's view of one SKU: units on the shelf, held for open
// orders, and sold to orders that ended.
type Stock struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
	Reserved  int64  `json:"reserved"`
	Sold      int64  `json:"sold"`
}

func routes(mux *http.ServeMux, db platform.DB, _ platform.Config) {
	pool := db.Pool // reads
	// PUT /stock sets the available quantity of each SKU given (seeding).
	mux.HandleFunc("PUT /stock", func(w http.ResponseWriter, r *http.Request) {
		var items []StockLevel
		if err := platform.ReadJSON(w, r, 4<<20, &items); err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New(`no body: want [{"sku": ..., "available": ...}]`)
			}
			platform.WriteError(w, http.StatusBadRequest, "decoding stock: "+err.Error())
			return
		}
		seen := map[string]bool{}
		for i, it := range items {
			if seen[it.SKU] {
				platform.WriteError(w, http.StatusBadRequest, fmt.Sprintf("item %d: sku %s is given twice", i+1, it.SKU))
				return
			}
			seen[it.SKU] = true
			if err := events.ValidateSKU(it.SKU); err != nil {
				platform.WriteError(w, http.StatusBadRequest, fmt.Sprintf("item %d: %v", i+1, err))
				return
			}
			if it.Available < 0 || it.Available > maxAvailable {
				platform.WriteError(w, http.StatusBadRequest, fmt.Sprintf("item %d (%s): available %d, want 0 to %d", i+1, it.SKU, it.Available, maxAvailable))
				return
			}
		}
		if err := setStock(r.Context(), db, items); err != nil {
			platform.WriteFailure(w, err)
			return
		}
		platform.WriteJSON(w, http.StatusOK, map[string]int{"updated": len(items)})
	})
	mux.HandleFunc("GET /stock", func(w http.ResponseWriter, r *http.Request) {
		items, err := listStock(r.Context(), pool)
		if err != nil {
			platform.WriteFailure(w, err)
			return
		}
		platform.WriteJSON(w, http.StatusOK, items)
	})
	mux.HandleFunc("GET /stock/{sku}", func(w http.ResponseWriter, r *http.Request) {
		if err := events.ValidateSKU(r.PathValue("sku")); err != nil {
			platform.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		var s Stock
		err := pool.QueryRow(r.Context(), `SELECT sku, available, reserved, sold FROM stock WHERE sku = $1`, r.PathValue("sku")).
			Scan(&s.SKU, &s.Available, &s.Reserved, &s.Sold)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			platform.WriteError(w, http.StatusNotFound, "unknown sku "+r.PathValue("sku"))
		case err != nil:
			platform.WriteFailure(w, err)
		default:
			platform.WriteJSON(w, http.StatusOK, s)
		}
	})
}

func setStock(ctx context.Context, db platform.DB, items []StockLevel) error {
	skus := make([]string, len(items))
	avail := make([]int32, len(items))
	for i, it := range items {
		skus[i], avail[i] = it.SKU, int32(it.Available)
	}
	err := db.Write(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `
			INSERT INTO stock (sku, available)
			SELECT * FROM unnest($1::text[], $2::int[])
			ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, updated_at = now()`, skus, avail)
		return err
	})
	if err != nil {
		return fmt.Errorf("setting stock: %w", err)
	}
	return nil
}

func listStock(ctx context.Context, pool *pgxpool.Pool) ([]Stock, error) {
	rows, err := pool.Query(ctx, `SELECT sku, available, reserved, sold FROM stock ORDER BY sku`)
	if err != nil {
		return nil, fmt.Errorf("listing stock: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Stock, error) {
		var s Stock
		err := row.Scan(&s.SKU, &s.Available, &s.Reserved, &s.Sold)
		return s, err
	})
}

// reserver applies OrderPaid and OrderCaptured events (see apply).
type reserver struct {
	// unguarded switches the domain guard off (DOMAIN_GUARD_DISABLED): only
	// the chaos harness's second control run does, to show what reaches the
	// domain when neither the inbox nor the guard stops it.
	unguarded bool
}

// reserveOrders is the guarded reserver's apply.
var reserveOrders = reserver{}.apply

// apply applies a batch of events in the inbox's transaction (the inbox
// hands it every delivery that arrived together; see pkg/inbox Handler).
//
// An OrderPaid reserves the order in full or rejects it: if any of its SKUs
// is unknown or short, the order is rejected. The orders are decided one
// after another, in the order they came, against what the earlier ones
// left, so a batch decides exactly as the same messages would one by one;
// only the statements are shared: one to look decisions up, one to lock the
// stock, then one per table written, however many orders the batch holds.
//
// An OrderCaptured ends a reserved order: its reserved units become sold
// (see fulfil).
//
// The domain guard: an order is decided once, and ends once. An OrderPaid
// for an order already decided (in an earlier transaction or earlier in
// this batch) is the inbox's blind spot, a second event under its own
// message id, and is refused with its reason in refusals, not applied; so
// is an OrderCaptured for an order inventory did not reserve, or that has
// already ended.
func (r reserver) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	var paid []*events.OrderPaid
	var paidMsgs []string
	var caps []capture
	var skus, orderIDs []string
	for _, msg := range msgs {
		ev, err := events.DecodeMessage(msg)
		if err != nil {
			return inbox.Permanent(err)
		}
		switch e := ev.(type) {
		case *events.OrderPaid:
			paid, paidMsgs = append(paid, e), append(paidMsgs, msg.UUID)
			for _, l := range e.Lines {
				skus = append(skus, l.SKU)
			}
			orderIDs = append(orderIDs, e.OrderID)
		case *events.OrderCaptured:
			caps = append(caps, capture{e.OrderID, msg.UUID})
			orderIDs = append(orderIDs, e.OrderID)
		default:
			return inbox.Permanent(fmt.Errorf("inventory does not consume %s", events.TypeOf(ev)))
		}
	}
	decided := map[string]decision{}
	if !r.unguarded {
		var err error
		if decided, err = lookUpDecisions(ctx, tx, orderIDs); err != nil {
			return err
		}
	}
	held, err := lookUpReservations(ctx, tx, caps)
	if err != nil {
		return err
	}
	for _, lines := range held {
		for sku := range lines {
			skus = append(skus, sku)
		}
	}
	slices.Sort(skus)
	have, err := lockStock(ctx, tx, slices.Compact(skus))
	if err != nil {
		return err
	}

	w := writes{guarded: !r.unguarded}
	for i, p := range paid {
		msgID := paidMsgs[i]
		if d, ok := decided[p.OrderID]; ok {
			w.refuse(p.OrderID, msgID, fmt.Sprintf("order already decided: %s by message %s", d.decision, d.messageID))
			continue
		}
		want := map[string]int{}
		for _, l := range p.Lines {
			want[l.SKU] += l.Quantity
		}
		d := decision{decision: "reserved", messageID: msgID, inBatch: true}
		if short := shortfall(want, have); len(short) > 0 {
			d.decision = "rejected"
			err = w.reject(p.OrderID, "insufficient stock: "+strings.Join(short, "; "), msgID)
		} else {
			err = w.reserve(p, want, have, msgID)
		}
		if err != nil {
			return err
		}
		if !r.unguarded {
			decided[p.OrderID] = d
		}
	}
	for _, c := range caps {
		r.fulfil(&w, c, decided, held[c.orderID])
	}
	return w.flush(ctx, tx)
}

// capture is an OrderCaptured to apply: the order it ends, and the message.
type capture struct{ orderID, messageID string }

// fulfil ends a reserved order: each of its reserved units becomes a sold
// one (reserved falls, sold grows; available does not move: the units left
// the shelf when they were reserved). Guarded, only an order inventory
// reserved in an earlier transaction ends, and only once; anything else is
// refused with its reason. An OrderCaptured can only be genuine once the
// reservation it follows has committed (orders captured the payment after
// it read InventoryReserved), so one arriving in the same batch as its
// order's OrderPaid is refused too.
func (r reserver) fulfil(w *writes, c capture, decided map[string]decision, lines map[string]int) {
	if !r.unguarded {
		d, ok := decided[c.orderID]
		var why string
		switch {
		case !ok:
			why = "inventory has not decided this order: nothing is reserved to sell"
		case d.inBatch:
			why = fmt.Sprintf("captured before inventory's decision (%s, by message %s, in this batch) committed", d.decision, d.messageID)
		case d.decision != "reserved":
			why = fmt.Sprintf("the order was %s by message %s: nothing is reserved to sell", d.decision, d.messageID)
		case d.fulfilledBy != "":
			why = "the order has already ended: fulfilled by message " + d.fulfilledBy
		}
		if why != "" {
			w.refuse(c.orderID, c.messageID, why)
			return
		}
		d.fulfilledBy = c.messageID
		decided[c.orderID] = d
		w.fulOrderDec, w.fulMsgDec = append(w.fulOrderDec, c.orderID), append(w.fulMsgDec, c.messageID)
	}
	for _, sku := range slices.Sorted(maps.Keys(lines)) {
		w.fulOrder, w.fulSKU, w.fulQty, w.fulMsg = append(w.fulOrder, c.orderID), append(w.fulSKU, sku), append(w.fulQty, int32(lines[sku])), append(w.fulMsg, c.messageID)
	}
}

// lookUpReservations returns, for each order caps end, the units reserved
// per SKU: what the order's reservation took. A reservation writes one row
// per SKU (its lines summed); the first is read, so that an order an
// unguarded run reserved twice is sold once per capture, not twice.
func lookUpReservations(ctx context.Context, tx pgx.Tx, caps []capture) (map[string]map[string]int, error) {
	held := map[string]map[string]int{}
	if len(caps) == 0 {
		return held, nil
	}
	ids := make([]string, len(caps))
	for i, c := range caps {
		ids[i] = c.orderID
	}
	rows, err := tx.Query(ctx, `
		SELECT DISTINCT ON (order_id, sku) order_id, sku, quantity
		FROM reservations WHERE order_id = ANY($1) ORDER BY order_id, sku, id`, platform.PlanEachTime, ids)
	if err != nil {
		return nil, fmt.Errorf("looking up reservations: %w", err)
	}
	var id, sku string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &sku, &n}, func() error {
		if held[id] == nil {
			held[id] = map[string]int{}
		}
		held[id][sku] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("looking up reservations: %w", err)
	}
	return held, nil
}

// decision is how inventory decided an order, and on which message; when
// the order has ended, the message that ended it.
type decision struct {
	decision, messageID, fulfilledBy string
	inBatch                          bool // decided in the batch being applied, not yet committed
}

// lookUpDecisions returns the decisions already taken on orderIDs.
func lookUpDecisions(ctx context.Context, tx pgx.Tx, orderIDs []string) (map[string]decision, error) {
	rows, err := tx.Query(ctx, `SELECT order_id, decision, message_id, coalesce(fulfilled_by, '') FROM decisions WHERE order_id = ANY($1)`, platform.PlanEachTime, orderIDs)
	if err != nil {
		return nil, fmt.Errorf("looking up decisions: %w", err)
	}
	decided := map[string]decision{}
	var id string
	var d decision
	if _, err := pgx.ForEachRow(rows, []any{&id, &d.decision, &d.messageID, &d.fulfilledBy}, func() error { decided[id] = d; return nil }); err != nil {
		return nil, fmt.Errorf("looking up decisions: %w", err)
	}
	return decided, nil
}

// lockStock locks the stock rows of skus (sorted: two batches touching the
// same SKUs then lock them in the same order and cannot deadlock) and
// returns what is available of each. Unknown SKUs are missing from the map.
func lockStock(ctx context.Context, tx pgx.Tx, skus []string) (map[string]int, error) {
	rows, err := tx.Query(ctx, `SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, platform.PlanEachTime, skus)
	if err != nil {
		return nil, fmt.Errorf("locking stock: %w", err)
	}
	have := map[string]int{}
	var sku string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&sku, &n}, func() error { have[sku] = n; return nil }); err != nil {
		return nil, fmt.Errorf("reading stock: %w", err)
	}
	return have, nil
}

// shortfall says, in SKU order, which of the wanted quantities the stock
// cannot cover: unknown SKUs and short ones.
func shortfall(want, have map[string]int) []string {
	var short []string
	for _, sku := range slices.Sorted(maps.Keys(want)) {
		n, known := have[sku]
		switch {
		case !known:
			short = append(short, fmt.Sprintf("unknown sku %s", sku))
		case n < want[sku]:
			short = append(short, fmt.Sprintf("%s: want %d, have %d", sku, want[sku], n))
		}
	}
	return short
}

// writes collects a batch's effects, column by column, for set-based
// statements.
type writes struct {
	guarded                   bool // record each decision (the guard's key)
	resOrder, resSKU, resMsg  []string
	resQty                    []int32
	rejOrder, rejReason       []string
	rejMsg                    []string
	decOrder, decName, decMsg []string
	refOrder, refMsg, refWhy  []string
	fulOrder, fulSKU, fulMsg  []string
	fulQty                    []int32
	fulOrderDec, fulMsgDec    []string // guarded: the orders that end, and by which message
	out                       []*message.Message
}

// reserve takes the order's quantities off have and records the
// reservation and the event that announces it.
func (w *writes) reserve(p *events.OrderPaid, want, have map[string]int, msgID string) error {
	w.decide(p.OrderID, "reserved", msgID)
	for sku, n := range want {
		have[sku] -= n
		w.resOrder, w.resSKU, w.resQty, w.resMsg = append(w.resOrder, p.OrderID), append(w.resSKU, sku), append(w.resQty, int32(n)), append(w.resMsg, msgID)
	}
	return w.announce(events.InventoryReserved{
		Envelope: events.NewEnvelope(events.TypeInventoryReserved, p.OrderID), Lines: p.Lines,
	})
}

// reject records the order's rejection and the event that announces it.
func (w *writes) reject(orderID, reason, msgID string) error {
	w.decide(orderID, "rejected", msgID)
	w.rejOrder, w.rejReason, w.rejMsg = append(w.rejOrder, orderID), append(w.rejReason, reason), append(w.rejMsg, msgID)
	return w.announce(events.InventoryRejected{
		Envelope: events.NewEnvelope(events.TypeInventoryRejected, orderID), Reason: reason,
	})
}

func (w *writes) decide(orderID, decision, msgID string) {
	if w.guarded {
		w.decOrder, w.decName, w.decMsg = append(w.decOrder, orderID), append(w.decName, decision), append(w.decMsg, msgID)
	}
}

// refuse records an event the guard refused, and why.
func (w *writes) refuse(orderID, msgID, reason string) {
	w.refOrder, w.refMsg, w.refWhy = append(w.refOrder, orderID), append(w.refMsg, msgID), append(w.refWhy, reason)
}

func (w *writes) announce(ev events.Event) error {
	msg, err := events.Message(ev)
	if err != nil {
		return err
	}
	w.out = append(w.out, msg)
	return nil
}

// flush writes the decisions, the reservations (taking their quantities off
// the stock), the fulfilments (selling what was reserved), the rejections,
// the refusals and the announcing events.
func (w *writes) flush(ctx context.Context, tx pgx.Tx) error {
	if len(w.decOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO decisions (order_id, decision, message_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`, w.decOrder, w.decName, w.decMsg); err != nil {
			return fmt.Errorf("recording decisions: %w", err)
		}
	}
	if len(w.refOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO refusals (order_id, message_id, reason)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`, w.refOrder, w.refMsg, w.refWhy); err != nil {
			return fmt.Errorf("recording refusals: %w", err)
		}
	}
	if len(w.resOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			UPDATE stock s SET available = s.available - u.qty, reserved = s.reserved + u.qty, updated_at = now()
			FROM (SELECT sku, sum(qty)::int AS qty FROM unnest($1::text[], $2::int[]) AS r(sku, qty) GROUP BY sku) AS u
			WHERE s.sku = u.sku AND s.sku = ANY($1)`, platform.PlanEachTime, w.resSKU, w.resQty); err != nil {
			return fmt.Errorf("reserving stock: %w", err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO reservations (order_id, sku, quantity, message_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[])`,
			w.resOrder, w.resSKU, w.resQty, w.resMsg); err != nil {
			return fmt.Errorf("recording reservations: %w", err)
		}
	}
	if len(w.fulOrderDec) > 0 {
		// Only an order that has not ended ends here. The decisions were
		// read before the stock was locked: a second OrderCaptured of the
		// same order under another id, applied at the same time by another
		// batch, read them too. Whichever commits second finds the order
		// ended here, fails, and is retried: it then reads the order as
		// ended and refuses the capture (TestConcurrentCapturesSellOnce).
		tag, err := tx.Exec(ctx, `
			UPDATE decisions d SET fulfilled_by = u.msg, fulfilled_at = now()
			FROM unnest($1::text[], $2::text[]) AS u(order_id, msg) WHERE d.order_id = u.order_id AND d.order_id = ANY($1) AND d.fulfilled_by IS NULL`,
			platform.PlanEachTime, w.fulOrderDec, w.fulMsgDec)
		if err != nil {
			return fmt.Errorf("recording the orders that ended: %w", err)
		}
		if n := tag.RowsAffected(); n != int64(len(w.fulOrderDec)) {
			return fmt.Errorf("%d of %d orders ended meanwhile, by another capture applied at the same time: retrying", int64(len(w.fulOrderDec))-n, len(w.fulOrderDec))
		}
	}
	if len(w.fulOrder) > 0 {
		// Unguarded (the control run), a second sale of one order's units
		// would take reserved below zero, and its CHECK, a guard of its
		// own, would fail the transaction over and over: the copy would
		// stall its partition instead of showing what reaches the domain
		// when nothing guards it. So reserved floors at zero there, and the
		// double sale shows in sold and in fulfilments, where the checker
		// counts it.
		if _, err := tx.Exec(ctx, `
			UPDATE stock s SET reserved = CASE WHEN $3 THEN s.reserved - u.qty ELSE greatest(s.reserved - u.qty, 0) END,
				sold = s.sold + u.qty, updated_at = now()
			FROM (SELECT sku, sum(qty) AS qty FROM unnest($1::text[], $2::int[]) AS f(sku, qty) GROUP BY sku) AS u
			WHERE s.sku = u.sku AND s.sku = ANY($1)`, platform.PlanEachTime, w.fulSKU, w.fulQty, w.guarded); err != nil {
			return fmt.Errorf("selling reserved stock: %w", err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO fulfilments (order_id, sku, quantity, message_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[])`,
			w.fulOrder, w.fulSKU, w.fulQty, w.fulMsg); err != nil {
			return fmt.Errorf("recording fulfilments: %w", err)
		}
	}
	if len(w.rejOrder) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO rejections (order_id, reason, message_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[])`, w.rejOrder, w.rejReason, w.rejMsg); err != nil {
			return fmt.Errorf("recording rejections: %w", err)
		}
	}
	return outbox.PublishTx(ctx, tx, events.TopicInventory, w.out...)
}
