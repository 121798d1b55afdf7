package provider

// The HTTP API. POST /v1/captures and POST /v1/refunds go through the same
// steps (servePost, post.go), in this order: check the headers and the body
// (4xx, nothing stored), the injected 500 (nothing done, nothing stored),
// claim the idempotency key (replay, 422, 409), the latency, execute (a
// capture or decline; a refund or an executed refusal; and store the
// response under the key, in one transaction), and answer, or, for a lost
// response, close the connection without a word. Every POST needs the
// token when the server has one (HTTP_TOKEN, httpserve.RequireToken in
// Run); the GETs need none.
//
//	POST /v1/captures            capture (200) or decline (402)
//	GET  /v1/captures?reference= the attempts for one order
//	GET  /v1/captures/{id}
//	GET  /v1/ledger              every attempt, a page at a time
//	POST /v1/refunds             refund a capture, all or part (refunds.go)
//	GET  /v1/refunds?capture=    or ?reference=: its refunds
//	GET  /v1/refunds/{id}

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Headers of the idempotency protocol, as Stripe names them.
const (
	HeaderIdempotencyKey  = "Idempotency-Key"
	HeaderReplayed        = "Idempotent-Replayed" // "true" on a stored response
	HeaderOriginalRequest = "Original-Request"    // on a replay: the Request-Id that executed
	HeaderRequestID       = "Request-Id"
)

// executeTimeout bounds the work of a POST once its key is claimed. The
// work goes on when the client goes away (a real provider does not undo a
// capture because the merchant hung up), so it needs a bound of its own.
const executeTimeout = 30 * time.Second

// Handler returns the provider's HTTP API.
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/captures", p.createCapture)
	mux.HandleFunc("GET /v1/captures", p.listByReference)
	mux.HandleFunc("GET /v1/captures/{id}", p.getCapture)
	mux.HandleFunc("GET /v1/ledger", p.ledger)
	mux.HandleFunc("POST /v1/refunds", p.createRefund)
	mux.HandleFunc("GET /v1/refunds", p.listRefunds)
	mux.HandleFunc("GET /v1/refunds/{id}", p.getRefund)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n")) //nolint:errcheck
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := p.pool.Ping(ctx); err != nil {
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n")) //nolint:errcheck
	})
	return mux
}

// createCapture answers POST /v1/captures: capture or decline, once per
// Idempotency-Key (servePost).
func (p *Provider) createCapture(w http.ResponseWriter, r *http.Request) {
	p.servePost(w, r, func(body []byte) (postCall, error) {
		req, err := parseCaptureRequest(body)
		if err != nil {
			return postCall{}, err
		}
		return postCall{what: "capture", params: req, attrs: []any{"reference", req.Reference, "amount", req.Amount},
			execute: func(ctx context.Context, key, token, reqID string) (result, error) {
				status, body, c, err := p.execute(ctx, req, key, token, reqID)
				return result{status: status, body: body, captureID: c.ID, attrs: []any{"capture", c.ID, "status", c.Status}}, err
			}}, nil
	})
}

// execute captures or declines req and records the attempt, with its
// response stored under key (if any) in the same transaction (commit):
// the capture is written only if token still holds the key (errLostKey
// otherwise).
func (p *Provider) execute(ctx context.Context, req CaptureRequest, key, token, reqID string) (int, []byte, Capture, error) {
	now := p.cfg.Now()
	c := Capture{ID: newID("cap_"), Object: "capture", Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, Source: req.Source, Status: StatusCaptured, IdempotencyKey: key, Created: now.Unix()}
	res := result{status: http.StatusOK, captureID: c.ID}
	if DeclinedSources[req.Source] || (p.cfg.DeclineAmount != 0 && req.Amount == p.cfg.DeclineAmount) {
		c.Status, c.DeclineCode = StatusDeclined, "generic_decline"
		res.status = http.StatusPaymentRequired
		res.body = marshal(ErrorBody{APIError{Type: "card_error", Code: "card_declined", DeclineCode: c.DeclineCode,
			Message: "Your card was declined.", Capture: &c}})
	} else {
		res.body = marshal(c)
	}
	_, err := p.commit(ctx, key, token, now, func(tx pgx.Tx) (result, error) {
		_, err := tx.Exec(ctx, `INSERT INTO captures
			(id, amount, currency, reference, source, status, decline_code, idempotency_key, request_id, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''), NULLIF($8, ''), $9, $10)`,
			c.ID, c.Amount, c.Currency, c.Reference, c.Source, c.Status, c.DeclineCode, key, reqID, now)
		return res, err
	})
	if err != nil && !errors.Is(err, errLostKey) {
		err = fmt.Errorf("storing the capture and its response: %w", err)
	}
	return res.status, res.body, c, err
}

func (p *Provider) getCapture(w http.ResponseWriter, r *http.Request) {
	getByID(p, w, r, "capture", p.query)
}

// getByID answers GET /v1/<what>s/{id} with the one find finds.
func getByID[T any](p *Provider, w http.ResponseWriter, r *http.Request, what string, find func(context.Context, string, int, any) ([]T, bool, error)) {
	id := r.PathValue("id")
	if !textParam(w, "id", id) {
		return
	}
	list, _, err := find(r.Context(), `WHERE id = $1`, 1, id)
	switch {
	case err != nil:
		p.internalError(w, err)
	case len(list) == 0:
		writeError(w, http.StatusNotFound, APIError{Type: "invalid_request_error", Code: "resource_missing", Param: "id", Message: "no such " + what})
	default:
		writeJSON(w, http.StatusOK, list[0])
	}
}

// listByReference answers GET /v1/captures?reference=…: every attempt for
// one order, oldest first (at most 1,000).
func (p *Provider) listByReference(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	if ref == "" {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "reference", Message: "reference is required"})
		return
	}
	if !textParam(w, "reference", ref) {
		return
	}
	list, more, err := p.query(r.Context(), `WHERE reference = $1`, 1000, ref)
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, List{Object: "list", Data: list, HasMore: more})
}

// textParam answers 400 (false) unless the path or query parameter name
// is storable.
func textParam(w http.ResponseWriter, name, value string) bool {
	if storable(value) {
		return true
	}
	writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: name, Message: name + " must be printable text of at most 255 bytes"})
	return false
}

// ledger answers GET /v1/ledger?limit=&starting_after=: every attempt,
// captured and declined, in the order they were written, a page at a time
// (limit 1..1000, default 100; starting_after is the last id of the
// previous page), for a checker to compare with the merchant's books.
func (p *Provider) ledger(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "limit", Message: "limit must be an integer in 1..1000"})
			return
		}
		limit = n
	}
	var after int64
	if id := q.Get("starting_after"); id != "" && !textParam(w, "starting_after", id) {
		return
	} else if id != "" {
		err := p.pool.QueryRow(r.Context(), `SELECT seq FROM captures WHERE id = $1`, id).Scan(&after)
		if errors.Is(err, pgx.ErrNoRows) {
			writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "starting_after", Message: "no such capture"})
			return
		}
		if err != nil {
			p.internalError(w, err)
			return
		}
	}
	list, more, err := p.query(r.Context(), `WHERE seq > $1`, limit, after)
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, List{Object: "list", Data: list, HasMore: more})
}

// query returns up to limit captures matching where (with its one
// argument), in seq order, and whether there were more.
func (p *Provider) query(ctx context.Context, where string, limit int, arg any) ([]Capture, bool, error) {
	rows, err := p.pool.Query(ctx, `SELECT id, amount, currency, reference, source, status,
		coalesce(decline_code, ''), coalesce(idempotency_key, ''), created_at
		FROM captures `+where+` ORDER BY seq LIMIT $2`, arg, limit+1)
	return collectPage(rows, err, limit, func(row pgx.CollectableRow) (Capture, error) {
		c := Capture{Object: "capture"}
		var created time.Time
		err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.Reference, &c.Source, &c.Status, &c.DeclineCode, &c.IdempotencyKey, &created)
		c.Created = created.Unix()
		return c, err
	})
}

// collectPage scans the rows of a query that asked for limit+1 (or its
// error): at most limit of them, and whether there were more.
func collectPage[T any](rows pgx.Rows, err error, limit int, scan func(pgx.CollectableRow) (T, error)) ([]T, bool, error) {
	if err != nil {
		return nil, false, err
	}
	list, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, false, err
	}
	if len(list) > limit {
		return list[:limit], true, nil
	}
	return list, false, nil
}

func (p *Provider) internalError(w http.ResponseWriter, err error) {
	p.log.Error("request failed", "err", err)
	writeError(w, http.StatusInternalServerError, APIError{Type: "api_error", Message: "internal error"})
}

func writeInvalid(w http.ResponseWriter, err error) {
	e := APIError{Type: "invalid_request_error", Message: err.Error()}
	var inv *invalidRequest
	if errors.As(err, &inv) {
		e.Param = inv.param
	}
	writeError(w, http.StatusBadRequest, e)
}

func writeError(w http.ResponseWriter, status int, e APIError) {
	writeRaw(w, status, marshal(ErrorBody{Error: e}))
}

func writeJSON(w http.ResponseWriter, status int, v any) { writeRaw(w, status, marshal(v)) }

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client went away
}

// storable reports whether an identifier from a path or a query is text
// the database can compare (valid UTF-8, no NUL or other control
// character, at most 255 bytes): anything else cannot name a capture, and
// would fail the query with a 500.
func storable(s string) bool {
	return len(s) <= 255 && utf8.ValidString(s) && printable(s)
}
