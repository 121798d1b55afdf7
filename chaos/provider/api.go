package provider

// The HTTP API. POST /v1/captures goes, in this order: check the headers
// and the body (4xx, nothing stored), the injected 500 (nothing done,
// nothing stored), claim the idempotency key (replay, 422, 409), the
// latency, execute (capture or decline, and store the response under the
// key, in one transaction), and answer, or, for a lost response, close the
// connection without a word.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxref/outbox-inbox/pkg/standby"
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

func (p *Provider) createCapture(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	reqID := newID("req_")
	w.Header().Set(HeaderRequestID, reqID)
	fate := p.draw()
	log := p.log.With("request_id", reqID)

	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, APIError{Type: "invalid_request_error", Message: "Content-Type must be application/json"})
			return
		}
	}
	keys := r.Header.Values(HeaderIdempotencyKey)
	if len(keys) > 1 {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: HeaderIdempotencyKey, Message: "Idempotency-Key must be sent once"})
		return
	}
	var key string
	if len(keys) == 1 {
		key = keys[0]
		if err := validKey(key); err != nil {
			writeInvalid(w, err)
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, APIError{Type: "invalid_request_error", Message: "body larger than " + strconv.Itoa(MaxBodyBytes) + " bytes"})
			return
		}
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Message: "reading body: " + err.Error()})
		return
	}
	req, err := parseCaptureRequest(body)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	log = log.With("key", key, "reference", req.Reference, "amount", req.Amount)
	if fate.fail {
		log.Warn("injected failure: 500 before anything was done or stored")
		writeError(w, http.StatusInternalServerError, APIError{Type: "api_error", Message: "injected failure; nothing was done, retry"})
		return
	}

	// From here on the request is executed whatever the client does.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), executeTimeout)
	defer cancel()
	var token string
	if key != "" {
		c, err := p.claimKey(ctx, key, fingerprint(r.Method, r.URL.Path, req), reqID, p.cfg.Now())
		if err != nil {
			log.Error("claiming the idempotency key failed", "err", err)
			writeError(w, http.StatusInternalServerError, APIError{Type: "api_error", Message: "internal error; nothing was done, retry"})
			return
		}
		switch c.outcome {
		case replay:
			log.Info("replayed the stored response", "status", c.status, "original_request", c.origReq)
			w.Header().Set(HeaderReplayed, "true")
			w.Header().Set(HeaderOriginalRequest, c.origReq)
			writeRaw(w, c.status, c.body)
			return
		case mismatch:
			log.Warn("idempotency key reused with another request")
			writeError(w, http.StatusUnprocessableEntity, APIError{Type: "idempotency_error", Code: "idempotency_key_mismatch",
				Message: "this Idempotency-Key was used with different parameters; use a new key for a different request"})
			return
		case inUse:
			log.Info("idempotency key in use by a request in flight", "holder", c.origReq)
			writeError(w, http.StatusConflict, APIError{Type: "idempotency_error", Code: "idempotency_key_in_use",
				Message: "another request with this Idempotency-Key is in progress; retry later"})
			return
		}
		token = c.token
	}

	if fate.latency > 0 {
		time.Sleep(fate.latency) // the card network; the key is held meanwhile
	}
	status, resp, capture, err := p.execute(ctx, req, key, token, reqID)
	switch {
	case errors.Is(err, errLostKey):
		log.Warn("the idempotency key was taken over during execution; nothing captured", "err", err)
		writeError(w, http.StatusConflict, APIError{Type: "idempotency_error", Code: "idempotency_key_in_use",
			Message: "another request with this Idempotency-Key is in progress; retry later"})
		return
	case err != nil:
		log.Error("executing the capture failed; nothing captured", "err", err)
		if key != "" {
			if err := p.releaseKey(ctx, key, token); err != nil {
				log.Error("releasing the key failed; it is taken over after the lock timeout", "err", err)
			}
		}
		writeError(w, http.StatusInternalServerError, APIError{Type: "api_error", Message: "internal error; nothing was done, retry"})
		return
	}
	log = log.With("capture", capture.ID, "status", capture.Status, "took", time.Since(start).Round(time.Microsecond))
	if fate.lost {
		log.Warn("lost response: executed and committed, closing the connection unanswered", "after", p.cfg.LostResponseDelay)
		p.loseResponse(w, r)
		return
	}
	log.Info("executed")
	writeRaw(w, status, resp)
}

// execute captures or declines req and records the attempt, with its
// response stored under key (if any) in the same transaction.
func (p *Provider) execute(ctx context.Context, req CaptureRequest, key, token, reqID string) (int, []byte, Capture, error) {
	now := p.cfg.Now()
	c := Capture{ID: newID("cap_"), Object: "capture", Amount: req.Amount, Currency: req.Currency,
		Reference: req.Reference, Source: req.Source, Status: StatusCaptured, IdempotencyKey: key, Created: now.Unix()}
	status, body := http.StatusOK, []byte(nil)
	if DeclinedSources[req.Source] || (p.cfg.DeclineAmount != 0 && req.Amount == p.cfg.DeclineAmount) {
		c.Status, c.DeclineCode = StatusDeclined, "generic_decline"
		status = http.StatusPaymentRequired
		body = marshal(ErrorBody{APIError{Type: "card_error", Code: "card_declined", DeclineCode: c.DeclineCode,
			Message: "Your card was declined.", Capture: &c}})
	} else {
		body = marshal(c)
	}
	err := p.insertCapture(ctx, c, key, token, reqID, status, body, now)
	return status, body, c, err
}

// insertCapture writes the capture and, under a key, stores the response
// with it, in one statement (one round trip, one transaction): the capture
// is written only if token still holds the key (errLostKey otherwise).
func (p *Provider) insertCapture(ctx context.Context, c Capture, key, token, reqID string, status int, body []byte, now time.Time) error {
	const insert = `INSERT INTO captures
		(id, amount, currency, reference, source, status, decline_code, idempotency_key, request_id, created_at)
		SELECT $1, $2, $3, $4, $5, $6, NULLIF($7, ''), NULLIF($8, ''), $9, $10`
	args := []any{c.ID, c.Amount, c.Currency, c.Reference, c.Source, c.Status, c.DeclineCode, key, reqID, now}
	statement := insert
	if key != "" {
		statement, args = completeKey+insert+` WHERE EXISTS (SELECT FROM completed)`, append(args, token, status, body)
	}
	var tag pgconn.CommandTag
	var ticket standby.Ticket
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) (err error) {
		if tag, err = tx.Exec(ctx, statement, args...); err != nil {
			return err
		}
		ticket, err = p.standby.Mark(ctx, tx) // nothing without PROVIDER_DATABASE_STANDBYS
		return err
	})
	if err != nil {
		return fmt.Errorf("storing the capture and its response: %w", err)
	}
	if key != "" && tag.RowsAffected() == 0 {
		return errLostKey
	}
	// Answered once its standbys hold it. If they do not confirm it, the
	// client's retry under the same key finds the stored response, or,
	// if a failover took it, captures anew: once either way.
	return p.standby.Wait(ctx, ticket)
}

// loseResponse closes the connection without answering, after
// LostResponseDelay, or sooner when the client gives up or the provider
// shuts down.
func (p *Provider) loseResponse(w http.ResponseWriter, r *http.Request) {
	if d := p.cfg.LostResponseDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		case <-p.stopping:
			t.Stop()
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler) // HTTP/2: the stream is reset
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}

func (p *Provider) getCapture(w http.ResponseWriter, r *http.Request) {
	if !storable(r.PathValue("id")) {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "id", Message: "id must be printable text of at most 255 bytes"})
		return
	}
	list, _, err := p.query(r.Context(), `WHERE id = $1`, 1, r.PathValue("id"))
	switch {
	case err != nil:
		p.internalError(w, err)
	case len(list) == 0:
		writeError(w, http.StatusNotFound, APIError{Type: "invalid_request_error", Code: "resource_missing", Param: "id", Message: "no such capture"})
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
	if !storable(ref) {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "reference", Message: "reference must be printable text of at most 255 bytes"})
		return
	}
	list, more, err := p.query(r.Context(), `WHERE reference = $1`, 1000, ref)
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, List{Object: "list", Data: list, HasMore: more})
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
	if id := q.Get("starting_after"); id != "" && !storable(id) {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "starting_after", Message: "starting_after must be printable text of at most 255 bytes"})
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
	if err != nil {
		return nil, false, err
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Capture, error) {
		c := Capture{Object: "capture"}
		var created time.Time
		err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.Reference, &c.Source, &c.Status, &c.DeclineCode, &c.IdempotencyKey, &created)
		c.Created = created.Unix()
		return c, err
	})
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
