package provider

// The steps every POST shares (POST /v1/captures, POST /v1/refunds), in
// this order: check the headers and the body (4xx, nothing stored), the
// injected 500 (nothing done, nothing stored), claim the idempotency key
// (replay, 422, 409), the latency, execute (the effect and its response
// stored under the key in one transaction, commit), and answer, or, for a
// lost response, close the connection without a word. An endpoint adds
// only how its body is read and what executing it does (postCall).

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// result is what one execution answers, and what its key stores.
type result struct {
	status int
	body   []byte
	// captureID and refundID link the key row to what the request made
	// (idempotency_keys.capture_id, refund_id); "" for nothing.
	captureID, refundID string
	attrs               []any // logged once executed
}

// postCall is one POST whose body was read and checked.
type postCall struct {
	what   string // "capture", "refund": for the logs
	params any    // the parsed body, fingerprinted with the method and path
	attrs  []any  // logged with every line of the request
	// execute does the work under key and token ("" without a key) in
	// one transaction (Provider.commit), or returns an error and nothing
	// was done (errLostKey: the key was taken over).
	execute func(ctx context.Context, key, token, reqID string) (result, error)
}

// servePost runs a POST through the shared steps; parse reads and checks
// its body (an *invalidRequest for a 400 with the parameter at fault).
func (p *Provider) servePost(w http.ResponseWriter, r *http.Request, parse func(body []byte) (postCall, error)) {
	start := time.Now()
	reqID := newID("req_")
	w.Header().Set(HeaderRequestID, reqID)
	fate := p.draw()
	log := p.log.With("request_id", reqID)

	key, body, ok := readPost(w, r)
	if !ok {
		return
	}
	call, err := parse(body)
	if err != nil {
		writeInvalid(w, err)
		return
	}
	log = log.With(append([]any{"key", key}, call.attrs...)...)
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
		c, err := p.claimKey(ctx, key, fingerprint(r.Method, r.URL.Path, call.params), reqID, p.cfg.Now())
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
			writeInUse(w)
			return
		}
		token = c.token
	}

	if fate.latency > 0 {
		time.Sleep(fate.latency) // the card network; the key is held meanwhile
	}
	res, err := call.execute(ctx, key, token, reqID)
	switch {
	case errors.Is(err, errLostKey):
		log.Warn("the idempotency key was taken over during execution; nothing done", "what", call.what, "err", err)
		writeInUse(w)
		return
	case err != nil:
		log.Error("executing failed; nothing done", "what", call.what, "err", err)
		if key != "" {
			if err := p.releaseKey(ctx, key, token); err != nil {
				log.Error("releasing the key failed; it is taken over after the lock timeout", "err", err)
			}
		}
		writeError(w, http.StatusInternalServerError, APIError{Type: "api_error", Message: "internal error; nothing was done, retry"})
		return
	}
	log = log.With(append(res.attrs, "http_status", res.status, "took", time.Since(start).Round(time.Microsecond))...)
	if fate.lost {
		log.Warn("lost response: executed and committed, closing the connection unanswered", "after", p.cfg.LostResponseDelay)
		p.loseResponse(w, r)
		return
	}
	log.Info("executed", "what", call.what)
	writeRaw(w, res.status, res.body)
}

// readPost checks a POST's Content-Type and Idempotency-Key and reads its
// body, or answers the 4xx itself (ok false).
func readPost(w http.ResponseWriter, r *http.Request) (key string, body []byte, ok bool) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, APIError{Type: "invalid_request_error", Message: "Content-Type must be application/json"})
			return "", nil, false
		}
	}
	keys := r.Header.Values(HeaderIdempotencyKey)
	if len(keys) > 1 {
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: HeaderIdempotencyKey, Message: "Idempotency-Key must be sent once"})
		return "", nil, false
	}
	if len(keys) == 1 {
		key = keys[0]
		if err := validKey(key); err != nil {
			writeInvalid(w, err)
			return "", nil, false
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, APIError{Type: "invalid_request_error", Message: "body larger than " + strconv.Itoa(MaxBodyBytes) + " bytes"})
			return "", nil, false
		}
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Message: "reading body: " + err.Error()})
		return "", nil, false
	}
	return key, body, true
}

func writeInUse(w http.ResponseWriter) {
	writeError(w, http.StatusConflict, APIError{Type: "idempotency_error", Code: "idempotency_key_in_use",
		Message: "another request with this Idempotency-Key is in progress; retry later"})
}

// commit runs write in one transaction and, under key, stores its result
// as the response under the key in the same transaction, if token still
// holds the key (errLostKey otherwise, and nothing is written). It returns
// once the database's standbys hold the commit (PROVIDER_DATABASE_STANDBYS).
func (p *Provider) commit(ctx context.Context, key, token string, now time.Time, write func(tx pgx.Tx) (result, error)) (result, error) {
	var (
		res    result
		ticket standby.Ticket
	)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) (err error) {
		if res, err = write(tx); err != nil {
			return err
		}
		if key != "" {
			if err := completeKey(ctx, tx, key, token, res, now); err != nil {
				return err
			}
		}
		ticket, err = p.standby.Mark(ctx, tx) // nothing without PROVIDER_DATABASE_STANDBYS
		return err
	})
	if err != nil {
		return res, err
	}
	// Answered once its standbys hold it. If they do not confirm it, the
	// client's retry under the same key finds the stored response, or,
	// if a failover took it, executes anew: once either way.
	return res, p.standby.Wait(ctx, ticket)
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
