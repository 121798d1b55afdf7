package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// api is the orders service's HTTP surface (docs/http-api.md): one named
// handler per route.
type api struct {
	db       platform.DB
	pool     *pgxpool.Pool // reads
	payments *platform.Group[string, payment]
}

func routes(mux *http.ServeMux, db platform.DB, cfg platform.Config) {
	a := &api{db: db, pool: db.Pool,
		// Payments that arrive together commit together (API_BATCH_SIZE).
		payments: platform.NewGroup(cfg.APIBatchSize, cfg.APIBatchWorkers, cfg.APIBatchLinger, 30*time.Second,
			func(ctx context.Context, ids []string) ([]payment, error) { return payOrders(ctx, db, ids) }),
	}
	mux.HandleFunc("POST /orders", a.create)
	mux.HandleFunc("POST /orders/{id}/pay", a.pay)
	mux.HandleFunc("POST /orders/{id}/payment/retry", a.retryPayment)
	mux.HandleFunc("POST /orders/{id}/payment/refund", a.refund)
	mux.HandleFunc("GET /orders/{id}", a.get)
	mux.HandleFunc("GET /orders", a.counts)
}

// create places an order: its lines, and the card its payment is captured
// with.
func (a *api) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Lines []events.Line `json:"lines"`
		Card  string        `json:"card,omitempty"` // a card token; tok_visa when absent
	}
	if err := platform.ReadJSON(w, r, 64<<10, &req); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("no body: want {\"lines\": [...]}")
		}
		platform.WriteError(w, http.StatusBadRequest, "decoding order: "+err.Error())
		return
	}
	if err := events.ValidateLines(req.Lines); err != nil {
		platform.WriteError(w, http.StatusBadRequest, "order refused: "+err.Error())
		return
	}
	if amount := events.Amount(req.Lines); amount > events.MaxAmount {
		platform.WriteError(w, http.StatusBadRequest, fmt.Sprintf("order refused: it costs %d cents, more than the %d one payment may capture", amount, events.MaxAmount))
		return
	}
	if req.Card == "" {
		req.Card = defaultCard
	}
	if !cardPattern.MatchString(req.Card) {
		platform.WriteError(w, http.StatusBadRequest, "order refused: card must be a card token (tok_ and 1 to 64 letters, digits or _)")
		return
	}
	o, err := createOrder(r.Context(), a.db, req.Lines, req.Card)
	respond(w, http.StatusCreated, o, err, false)
}

// pay pays an order: its status and its OrderPaid in one transaction, with
// the payments that arrive together.
func (a *api) pay(w http.ResponseWriter, r *http.Request) {
	p, err := a.payments.Do(r.Context(), r.PathValue("id"))
	if err == nil {
		err = p.err
	}
	if err == nil {
		failpoint.Hit(failpoint.AfterCommitBeforeResponse, p.order.ID)
	}
	respond(w, http.StatusOK, p.order, err, false)
}

// retryPayment captures an order's payment again, with another card if
// given (payment.go).
func (a *api) retryPayment(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Card string `json:"card,omitempty"` // the card to capture with now; the order's own when absent
	}
	if err := platform.ReadJSON(w, r, 4<<10, &req); err != nil && !errors.Is(err, io.EOF) {
		platform.WriteError(w, http.StatusBadRequest, "decoding the retry: "+err.Error())
		return
	}
	if req.Card != "" && !cardPattern.MatchString(req.Card) {
		platform.WriteError(w, http.StatusBadRequest, "retry refused: card must be a card token (tok_ and 1 to 64 letters, digits or _)")
		return
	}
	o, err := retryCapture(r.Context(), a.db, r.PathValue("id"), req.Card)
	var refused errRetryRefused
	respond(w, http.StatusAccepted, o, err, errors.As(err, &refused))
}

// refund gives an order's money back, for the reason given (refund.go).
func (a *api) refund(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Reason string `json:"reason"` // why the money goes back: the order's reject_reason says it
	}
	if err := platform.ReadJSON(w, r, 4<<10, &req); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("no body: want {\"reason\": \"...\"}")
		}
		platform.WriteError(w, http.StatusBadRequest, "decoding the refund: "+err.Error())
		return
	}
	if err := validReason(req.Reason); err != nil {
		platform.WriteError(w, http.StatusBadRequest, "refund refused: "+err.Error())
		return
	}
	o, err := requestRefund(r.Context(), a.db, r.PathValue("id"), req.Reason)
	var refused errRefundRefused
	respond(w, http.StatusAccepted, o, err, errors.As(err, &refused))
}

// get reads one order.
func (a *api) get(w http.ResponseWriter, r *http.Request) {
	o, err := getOrder(r.Context(), a.pool, r.PathValue("id"))
	respond(w, http.StatusOK, o, err, false)
}

// counts counts the orders by status and by payment.
func (a *api) counts(w http.ResponseWriter, r *http.Request) {
	byStatus, err := countByStatus(r.Context(), a.pool, "status")
	if err != nil {
		platform.WriteFailure(w, err)
		return
	}
	byPayment, err := countByStatus(r.Context(), a.pool, "payment")
	if err != nil {
		platform.WriteFailure(w, err)
		return
	}
	platform.WriteJSON(w, http.StatusOK, map[string]any{"by_status": byStatus, "by_payment": byPayment})
}

// respond writes o with status, or what err says: 404 for an order that is
// not there, 409 when the order's state refused the request, else
// WriteFailure's.
func respond(w http.ResponseWriter, status int, o Order, err error, refused bool) {
	switch {
	case errors.Is(err, errNotFound):
		platform.WriteError(w, http.StatusNotFound, err.Error())
	case refused:
		platform.WriteError(w, http.StatusConflict, err.Error())
	case err != nil:
		platform.WriteFailure(w, err)
	default:
		platform.WriteJSON(w, status, o)
	}
}
