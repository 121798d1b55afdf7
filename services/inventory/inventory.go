package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sort"
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
		Handle:     handleOrderPaid,
		Routes:     routes,
	}
}

// Stock is the API's view of one SKU.
type Stock struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
	Reserved  int    `json:"reserved"`
}

func routes(mux *http.ServeMux, pool *pgxpool.Pool) {
	// PUT /stock sets the available quantity of each SKU given (seeding).
	mux.HandleFunc("PUT /stock", func(w http.ResponseWriter, r *http.Request) {
		var items []Stock
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&items); err != nil {
			platform.WriteError(w, http.StatusBadRequest, "decoding stock: "+err.Error())
			return
		}
		for _, it := range items {
			if it.SKU == "" || it.Available < 0 {
				platform.WriteError(w, http.StatusBadRequest, fmt.Sprintf("item %+v: want a sku and available >= 0", it))
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

func setStock(ctx context.Context, pool *pgxpool.Pool, items []Stock) error {
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

// handleOrderPaid reserves every line of a paid order, or none: if any SKU
// is unknown or short, the order is rejected. The reservation (or rejection)
// and the event that announces it are written in the inbox's transaction.
func handleOrderPaid(msg *message.Message) error {
	ev, err := events.Decode(msg.Payload)
	if err != nil {
		return inbox.Permanent(err)
	}
	paid, ok := ev.(*events.OrderPaid)
	if !ok {
		return inbox.Permanent(fmt.Errorf("inventory does not consume %T", ev))
	}
	ctx := msg.Context()
	tx := inbox.Tx(ctx)

	// Sum quantities per SKU and lock the rows in SKU order, so two orders
	// touching the same SKUs cannot deadlock.
	want := map[string]int{}
	for _, l := range paid.Lines {
		want[l.SKU] += l.Quantity
	}
	skus := make([]string, 0, len(want))
	for sku := range want {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	rows, err := tx.Query(ctx, `SELECT sku, available FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, skus)
	if err != nil {
		return fmt.Errorf("locking stock: %w", err)
	}
	have := map[string]int{}
	for rows.Next() {
		var sku string
		var n int
		if err := rows.Scan(&sku, &n); err != nil {
			rows.Close()
			return fmt.Errorf("reading stock: %w", err)
		}
		have[sku] = n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading stock: %w", err)
	}

	var short []string
	for _, sku := range skus {
		n, known := have[sku]
		switch {
		case !known:
			short = append(short, fmt.Sprintf("unknown sku %s", sku))
		case n < want[sku]:
			short = append(short, fmt.Sprintf("%s: want %d, have %d", sku, want[sku], n))
		}
	}
	if len(short) > 0 {
		return reject(ctx, tx, msg, paid.OrderID, "insufficient stock: "+strings.Join(short, "; "))
	}

	qty := make([]int32, len(skus))
	for i, sku := range skus {
		qty[i] = int32(want[sku])
	}
	if _, err := tx.Exec(ctx, `
		UPDATE stock s SET available = s.available - u.qty, reserved = s.reserved + u.qty, updated_at = now()
		FROM unnest($1::text[], $2::int[]) AS u(sku, qty)
		WHERE s.sku = u.sku`, skus, qty); err != nil {
		return fmt.Errorf("reserving stock: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO reservations (order_id, sku, quantity, message_id)
		SELECT $1, u.sku, u.qty, $4 FROM unnest($2::text[], $3::int[]) AS u(sku, qty)`,
		paid.OrderID, skus, qty, msg.UUID); err != nil {
		return fmt.Errorf("recording reservation: %w", err)
	}
	return announce(ctx, tx, paid.OrderID, events.InventoryReserved{
		Envelope: events.NewEnvelope(events.TypeInventoryReserved, paid.OrderID), Lines: paid.Lines,
	})
}

func reject(ctx context.Context, tx pgx.Tx, msg *message.Message, orderID, reason string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO rejections (order_id, reason, message_id) VALUES ($1, $2, $3)`,
		orderID, reason, msg.UUID); err != nil {
		return fmt.Errorf("recording rejection: %w", err)
	}
	return announce(ctx, tx, orderID, events.InventoryRejected{
		Envelope: events.NewEnvelope(events.TypeInventoryRejected, orderID), Reason: reason,
	})
}

func announce(ctx context.Context, tx pgx.Tx, orderID string, ev any) error {
	payload, err := events.Encode(ev)
	if err != nil {
		return err
	}
	return outbox.PublishTx(ctx, tx, events.TopicInventory, outbox.NewMessage(orderID, payload))
}
