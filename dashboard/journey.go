package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
)

// Journey is one order's path through the system, read from both
// databases: every step with its time and the table it lives in.
type Journey struct {
	Order    string `json:"order"`
	Status   string `json:"status"`
	TraceID  string `json:"trace_id,omitempty"` // of the payment's trace, for a tracing UI
	TraceURL string `json:"trace_url,omitempty"`
	Steps    []Step `json:"steps"`
}

// Step is one thing that happened to the order or one of its messages.
type Step struct {
	At    *time.Time `json:"at,omitempty"` // unset when the database keeps no time (a suppressed duplicate)
	Kind  string     `json:"kind"`         // created, paid, outbox, published, inbox, duplicate, decided, applied, quarantined
	What  string     `json:"what"`
	Where string     `json:"where"` // the service, the database table or Kafka topic it lives in
}

// errNoOrder is a journey asked for an order the orders database does not hold.
var errNoOrder = errors.New("no such order")

// message is an outbox row of the journey and what its consumer's inbox
// says about it.
type message struct {
	id, topic, typ, traceparent string
	created                     time.Time
	published                   *time.Time
	// at the consumer's inbox
	applied           *time.Time
	status            string
	duplicates        int
	partition, offset *int64
	quarantine        []string
}

// Journey reads one order's journey.
func (s *Server) Journey(ctx context.Context, orderID string) (Journey, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*s.opts.QueryTimeout)
	defer cancel()
	j := Journey{Order: orderID}
	var created time.Time
	var paid, settled *time.Time
	var reason *string
	err := s.opts.Orders.QueryRow(ctx, `SELECT status, created_at, paid_at, settled_at, reject_reason FROM orders WHERE id = $1`, orderID).
		Scan(&j.Status, &created, &paid, &settled, &reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return j, errNoOrder
	}
	if err != nil {
		return j, fmt.Errorf("orders database: %w", err)
	}
	j.add(&created, "created", "order created", "orders: table orders")
	if paid != nil {
		j.add(paid, "paid", "payment committed: status paid and OrderPaid written to the outbox, in one transaction", "orders: orders.paid_at")
	}

	asked, err := outboxMessages(ctx, s.opts.Orders, orderID)
	if err != nil {
		return j, fmt.Errorf("orders database: %w", err)
	}
	if err := atInbox(ctx, s.opts.Inventory, "inventory", asked); err != nil {
		return j, fmt.Errorf("inventory database: %w", err)
	}
	// OrderPaid asks inventory to decide; OrderCaptured, once the payment
	// is captured, ends the order: its steps come after the settlement.
	var ending []*message
	for _, m := range asked {
		if m.typ == events.TypeOrderCaptured {
			ending = append(ending, m)
			continue
		}
		j.message(m, "orders", "inventory")
		if j.TraceID == "" {
			j.TraceID = traceID(m.traceparent)
		}
	}

	var decision, decidedBy string
	var decided time.Time
	var ended *time.Time
	err = s.opts.Inventory.QueryRow(ctx, `SELECT decision, message_id, decided_at, fulfilled_at FROM decisions WHERE order_id = $1`, orderID).
		Scan(&decision, &decidedBy, &decided, &ended)
	switch {
	case err == nil:
		j.add(&decided, "decided", fmt.Sprintf("inventory %s the order, in the transaction that recorded OrderPaid %s in its inbox", decision, short(decidedBy)),
			"inventory: tables decisions, reservations")
	case !errors.Is(err, pgx.ErrNoRows):
		return j, fmt.Errorf("inventory database: %w", err)
	}

	answers, err := outboxMessages(ctx, s.opts.Inventory, orderID)
	if err != nil {
		return j, fmt.Errorf("inventory database: %w", err)
	}
	if err := atInbox(ctx, s.opts.Orders, "orders", answers); err != nil {
		return j, fmt.Errorf("orders database: %w", err)
	}
	for _, m := range answers {
		j.message(m, "inventory", "orders")
	}
	if settled != nil {
		what := "order " + j.Status
		if reason != nil && *reason != "" {
			what += ": " + *reason
		}
		j.add(settled, "settled", what, "orders: orders.settled_at")
	}
	for _, m := range ending {
		j.message(m, "orders", "inventory")
	}
	if ended != nil {
		j.add(ended, "ended", "payment captured, order ended: inventory turned its reserved units into sold ones, in the transaction that recorded OrderCaptured in its inbox",
			"inventory: tables decisions, fulfilments, stock")
	}
	return j, nil
}

func (j *Journey) add(at *time.Time, kind, what, where string) {
	j.Steps = append(j.Steps, Step{At: at, Kind: kind, What: what, Where: where})
}

// message adds the steps of one outbox row: written, published, and what
// the consumer's inbox did with it.
func (j *Journey) message(m *message, from, to string) {
	created := m.created
	j.add(&created, "outbox", fmt.Sprintf("%s %s written to %s outbox", m.typ, short(m.id), possessive(from)), from+": table outbox_messages")
	if m.published != nil {
		where := "Kafka: " + m.topic
		if m.partition != nil {
			where += fmt.Sprintf(", partition %d, offset %d", *m.partition, *m.offset)
		}
		j.add(m.published, "published", fmt.Sprintf("%s published by %s relay and marked", m.typ, possessive(from)), where)
	}
	if m.applied != nil {
		what := fmt.Sprintf("%s recorded in %s inbox (%s, %s): %s", m.typ, possessive(to), to, short(m.id), m.status)
		if m.status == "processed" {
			what = fmt.Sprintf("%s applied by %s: inbox row (%s, %s) committed with its writes", m.typ, to, to, short(m.id))
		}
		j.add(m.applied, "inbox", what, to+": table inbox_messages")
	}
	if m.duplicates > 0 {
		j.add(nil, "duplicate", fmt.Sprintf("%d redelivered cop%s of %s suppressed by %s inbox: the row was there, the handler did not run",
			m.duplicates, plural(m.duplicates, "y", "ies"), m.typ, possessive(to)), to+": inbox_messages.duplicates")
	}
	for _, q := range m.quarantine {
		j.add(nil, "quarantined", fmt.Sprintf("a copy of %s left the flow at %s: %s", m.typ, to, q), to+": table inbox_quarantine")
	}
}

// outboxMessages reads a service's outbox rows for one order, oldest first.
func outboxMessages(ctx context.Context, pool *pgxpool.Pool, orderID string) ([]*message, error) {
	rows, err := pool.Query(ctx, `
		SELECT message_id::text, topic, coalesce(convert_from(payload, 'UTF8')::jsonb->>'type', topic),
			coalesce(metadata->>$2, ''), created_at, published_at
		FROM outbox_messages WHERE partition_key = $1 AND topic IN ($3, $4) ORDER BY id`,
		orderID, outbox.TraceparentMetadata, events.TopicOrders, events.TopicInventory)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*message, error) {
		m := &message{}
		return m, row.Scan(&m.id, &m.topic, &m.typ, &m.traceparent, &m.created, &m.published)
	})
}

// atInbox fills in what consumer's inbox and quarantine hold for msgs.
func atInbox(ctx context.Context, pool *pgxpool.Pool, consumer string, msgs []*message) error {
	for _, m := range msgs {
		var partition, offset *int64
		var applied time.Time
		err := pool.QueryRow(ctx, `
			SELECT processed_at, status, duplicates, kafka_partition, kafka_offset
			FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, m.id).
			Scan(&applied, &m.status, &m.duplicates, &partition, &offset)
		switch {
		case err == nil:
			m.applied, m.partition, m.offset = &applied, partition, offset
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		rows, err := pool.Query(ctx, `SELECT kind || ': ' || reason FROM inbox_quarantine WHERE consumer = $1 AND message_id = $2 ORDER BY id`, consumer, m.id)
		if err != nil {
			return err
		}
		if m.quarantine, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
	}
	return nil
}

// traceID is the trace id of a W3C traceparent ("00-<trace>-<span>-01").
func traceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 || strings.Trim(parts[1], "0") == "" {
		return ""
	}
	return parts[1]
}

// possessive is "orders'" or "inventory's".
func possessive(name string) string {
	if strings.HasSuffix(name, "s") {
		return name + "'"
	}
	return name + "'s"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13] + "…"
	}
	return id
}

// Recent is an order the page offers to follow.
type Recent struct {
	ID      string    `json:"id"`
	Status  string    `json:"status"`
	Created time.Time `json:"created_at"`
}

// recent reads the newest orders.
func (s *Server) recent(ctx context.Context, n int) ([]Recent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
	defer cancel()
	rows, err := s.opts.Orders.Query(ctx, `SELECT id::text, status, created_at FROM orders ORDER BY created_at DESC LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Recent, error) {
		var r Recent
		return r, row.Scan(&r.ID, &r.Status, &r.Created)
	})
}

// journeyRoutes serves GET /journey.json?order=ID and GET /recent.json.
func (s *Server) journeyRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /journey.json", func(w http.ResponseWriter, r *http.Request) {
		id := strings.TrimSpace(r.URL.Query().Get("order"))
		u, err := uuid.Parse(id)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "order " + quote(id) + " is not an order id (a UUID)"})
			return
		}
		// The outbox and inventory keep the id as text, in this spelling.
		id = u.String()
		j, err := s.Journey(r.Context(), id)
		switch {
		case errors.Is(err, errNoOrder):
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "the orders database holds no order " + id})
		case err != nil:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		default:
			if j.TraceID != "" && s.opts.TraceURL != "" {
				j.TraceURL = strings.ReplaceAll(s.opts.TraceURL, "{trace_id}", j.TraceID)
			}
			writeJSON(w, http.StatusOK, j)
		}
	})
	mux.HandleFunc("GET /recent.json", func(w http.ResponseWriter, r *http.Request) {
		list, err := s.recent(r.Context(), 12)
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, list)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}
