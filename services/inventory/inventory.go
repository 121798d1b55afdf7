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
		Apply: func(cfg platform.Config) inbox.BatchFunc {
			return reserver{unguarded: cfg.DomainGuardDisabled}.apply
		},
		Routes: routes,
	}
}

// maxAvailable bounds the stock of one SKU set through the API: available is
// an int column and only falls from what was set. reserved only grows, over
// every restock, so it is a bigint (migration 003).
const maxAvailable = 1 << 30

// StockLevel is one item of PUT /stock: what is available of a SKU. The
// reserved units are inventory's to count, never a client's to set.
type StockLevel struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

// Stock is the API's view of one SKU.
type Stock struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
	Reserved  int    `json:"reserved"`
}

func routes(mux *http.ServeMux, pool *pgxpool.Pool, _ platform.Config) {
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
		if err := setStock(r.Context(), pool, items); err != nil {
			platform.WriteError(w, http.StatusInternalServerError, err.Error())
			return
		}
		platform.WriteJSON(w, http.StatusOK, map[string]int{"updated": len(items)})
	})
	mux.HandleFunc("GET /stock", func(w http.ResponseWriter, r *http.Request) {
		items, err := listStock(r.Context(), pool)
		if err != nil {
			platform.WriteError(w, http.StatusInternalServerError, err.Error())
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
		err := pool.QueryRow(r.Context(), `SELECT sku, available, reserved FROM stock WHERE sku = $1`, r.PathValue("sku")).
			Scan(&s.SKU, &s.Available, &s.Reserved)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			platform.WriteError(w, http.StatusNotFound, "unknown sku "+r.PathValue("sku"))
		case err != nil:
			platform.WriteError(w, http.StatusInternalServerError, err.Error())
		default:
			platform.WriteJSON(w, http.StatusOK, s)
		}
	})
}

func setStock(ctx context.Context, pool *pgxpool.Pool, items []StockLevel) error {
	skus := make([]string, len(items))
	avail := make([]int32, len(items))
	for i, it := range items {
		skus[i], avail[i] = it.SKU, int32(it.Available)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO stock (sku, available)
		SELECT * FROM unnest($1::text[], $2::int[])
		ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, updated_at = now()`, skus, avail)
	if err != nil {
		return fmt.Errorf("setting stock: %w", err)
	}
	return nil
}

func listStock(ctx context.Context, pool *pgxpool.Pool) ([]Stock, error) {
	rows, err := pool.Query(ctx, `SELECT sku, available, reserved FROM stock ORDER BY sku`)
	if err != nil {
		return nil, fmt.Errorf("listing stock: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Stock, error) {
		var s Stock
		err := row.Scan(&s.SKU, &s.Available, &s.Reserved)
		return s, err
	})
}

// reserver applies OrderPaid events (see apply).
type reserver struct {
	// unguarded switches the domain guard off (DOMAIN_GUARD_DISABLED): only
	// the chaos harness's second control run does, to show what reaches the
	// domain when neither the inbox nor the guard stops it.
	unguarded bool
}

// reserveOrders is the guarded reserver's apply.
var reserveOrders = reserver{}.apply

// apply applies a batch of OrderPaid events in the inbox's transaction (the
// inbox hands it every delivery that arrived together; see pkg/inbox
// Handler). Each order is reserved in full or rejected: if any of its SKUs
// is unknown or short, the order is rejected. The orders are decided one
// after another, in the order they came, against what the earlier ones left,
// so a batch decides exactly as the same messages would one by one; only the
// statements are shared: one to look decisions up, one to lock the stock,
// then one per table written, however many orders the batch holds.
//
// The domain guard: an order is decided once. An OrderPaid for an order
// already decided (in an earlier transaction or earlier in this batch) is
// the inbox's blind spot, a second event under its own message id, and is
// refused with its reason in refusals, not applied.
func (r reserver) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	paid := make([]*events.OrderPaid, len(msgs))
	var skus, orderIDs []string
	for i, msg := range msgs {
		ev, err := events.Decode(msg.Payload)
		if err != nil {
			return inbox.Permanent(err)
		}
		p, ok := ev.(*events.OrderPaid)
		if !ok {
			return inbox.Permanent(fmt.Errorf("inventory does not consume %s", events.TypeOf(ev)))
		}
		paid[i] = p
		orderIDs = append(orderIDs, p.OrderID)
		for _, l := range p.Lines {
			skus = append(skus, l.SKU)
		}
	}
	decided := map[string]decision{}
	if !r.unguarded {
		var err error
		if decided, err = lookUpDecisions(ctx, tx, orderIDs); err != nil {
			return err
		}
	}
	slices.Sort(skus)
	have, err := lockStock(ctx, tx, slices.Compact(skus))
	if err != nil {
		return err
	}

	w := writes{guarded: !r.unguarded}
	for i, p := range paid {
		msgID := msgs[i].UUID
		if d, ok := decided[p.OrderID]; ok {
			w.refuse(p.OrderID, msgID, fmt.Sprintf("order already decided: %s by message %s", d.decision, d.messageID))
			continue
		}
		want := map[string]int{}
		for _, l := range p.Lines {
			want[l.SKU] += l.Quantity
		}
		d := decision{"reserved", msgID}
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
	return w.flush(ctx, tx)
}

// decision is how inventory decided an order, and on which message.
type decision struct{ decision, messageID string }

// lookUpDecisions returns the decisions already taken on orderIDs.
func lookUpDecisions(ctx context.Context, tx pgx.Tx, orderIDs []string) (map[string]decision, error) {
	rows, err := tx.Query(ctx, `SELECT order_id, decision, message_id FROM decisions WHERE order_id = ANY($1)`, orderIDs)
	if err != nil {
		return nil, fmt.Errorf("looking up decisions: %w", err)
	}
	decided := map[string]decision{}
	var id string
	var d decision
	if _, err := pgx.ForEachRow(rows, []any{&id, &d.decision, &d.messageID}, func() error { decided[id] = d; return nil }); err != nil {
		return nil, fmt.Errorf("looking up decisions: %w", err)
	}
	return decided, nil
}

// lockStock locks the stock rows of skus (sorted: two batches touching the
// same SKUs then lock them in the same order and cannot deadlock) and
// returns what is available of each. Unknown SKUs are missing from the map.
func lockStock(ctx context.Context, tx pgx.Tx, skus []string) (map[string]int, error) {
	rows, err := tx.Query(ctx, `SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, skus)
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
	return w.announce(p.OrderID, events.InventoryReserved{
		Envelope: events.NewEnvelope(events.TypeInventoryReserved, p.OrderID), Lines: p.Lines,
	})
}

// reject records the order's rejection and the event that announces it.
func (w *writes) reject(orderID, reason, msgID string) error {
	w.decide(orderID, "rejected", msgID)
	w.rejOrder, w.rejReason, w.rejMsg = append(w.rejOrder, orderID), append(w.rejReason, reason), append(w.rejMsg, msgID)
	return w.announce(orderID, events.InventoryRejected{
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

func (w *writes) announce(orderID string, ev any) error {
	payload, err := events.Encode(ev)
	if err != nil {
		return err
	}
	w.out = append(w.out, outbox.NewMessage(orderID, payload))
	return nil
}

// flush writes the decisions, the reservations (taking their quantities off
// the stock), the rejections, the refusals and the announcing events.
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
			WHERE s.sku = u.sku`, w.resSKU, w.resQty); err != nil {
			return fmt.Errorf("reserving stock: %w", err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO reservations (order_id, sku, quantity, message_id)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[])`,
			w.resOrder, w.resSKU, w.resQty, w.resMsg); err != nil {
			return fmt.Errorf("recording reservations: %w", err)
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
