package main

// Capturing the payment: the third row of the pattern. The customer pays
// the order with a card token; the money is captured only once inventory
// has reserved the order. The capture is a call to the payment
// provider, outside this database, so it cannot share the inbox's
// transaction. Instead:
//
//  1. the intent is recorded (effect.EnqueueBatchTx) in the transaction that
//     applies InventoryReserved, so it exists if and only if the order is
//     reserved;
//  2. a pkg/effect Runner calls POST /v1/captures with the Idempotency-Key
//     capture-<order id>, retried with backoff; a call that performed the
//     capture but whose answer or record was lost is repeated with the same
//     key, and the provider answers with the stored response instead of
//     capturing again;
//  3. the outcome is recorded (captured with its id, declined, failed) in
//     the transaction that ends the effect; a capture also puts
//     OrderCaptured in the outbox there, and inventory turns the order's
//     reserved units into sold ones.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// captureKind is the effect kind of a capture.
const captureKind = "capture"

// defaultCard is the card an order without one pays with.
const defaultCard = "tok_visa"

var cardPattern = regexp.MustCompile(`^tok_[A-Za-z0-9_]{1,64}$`)

// capture is the intent: what to capture for one order.
type capture struct {
	OrderID  string `json:"order_id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Card     string `json:"card"`
}

// enqueueCaptures records the captures reserved orders ask for, in tx, in
// one statement.
func enqueueCaptures(ctx context.Context, tx pgx.Tx, captures []capture) error {
	intents := make([]effect.Intent, len(captures))
	for i, c := range captures {
		payload, err := json.Marshal(c)
		if err != nil {
			return err
		}
		intents[i] = effect.Intent{Key: events.CaptureKey(c.OrderID), Payload: payload}
	}
	_, err := effect.EnqueueBatchTx(ctx, tx, captureKind, intents)
	return err
}

// errRetryRefused says why an order's capture cannot be retried.
type errRetryRefused struct{ reason string }

func (e errRetryRefused) Error() string { return "retry refused: " + e.reason }

// retryCapture is a person acting on a declined or failed capture: it
// records a new capture of the order, with card (or the order's own card
// when empty), under the attempt's own key, in one transaction with the
// order's move back to 'capturing'. Only a reserved order whose last
// capture was declined or failed may be retried: a captured one is paid,
// one still capturing is being made.
func retryCapture(ctx context.Context, db platform.DB, id, card string) (Order, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Order{}, errNotFound
	}
	id = u.String() // any spelling uuid.Parse takes, as Postgres prints it
	var o Order
	err = db.Write(ctx, func(tx pgx.Tx) error {
		var c capture
		var attempt int
		err := tx.QueryRow(ctx, `
			UPDATE orders SET payment = 'capturing', card = coalesce(nullif($2, ''), card),
				capture_attempt = capture_attempt + 1, capture_id = NULL, payment_error = NULL, payment_at = NULL
			WHERE id = $1 AND status = 'reserved' AND payment IN ('declined', 'failed')
			RETURNING id::text, coalesce(amount, 0), card, capture_attempt, lines`, platform.PlanEachTime, id, card).
			Scan(&c.OrderID, &c.Amount, &c.Card, &attempt, &o.Lines)
		if errors.Is(err, pgx.ErrNoRows) {
			cur, rerr := readOrder(ctx, tx, id)
			switch {
			case rerr != nil:
				return rerr
			case cur.Status != "reserved":
				return errRetryRefused{fmt.Sprintf("order %s is %s: only a reserved order is captured", id, cur.Status)}
			default:
				return errRetryRefused{fmt.Sprintf("order %s's payment is %s: only a declined or failed capture is retried", id, cur.Payment)}
			}
		}
		if err != nil {
			return fmt.Errorf("retrying the capture: %w", err)
		}
		if c.Amount == 0 {
			c.Amount = events.Amount(o.Lines)
		}
		c.Currency = events.Currency
		payload, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if _, err := effect.EnqueueTx(ctx, tx, captureKind, events.RetryCaptureKey(c.OrderID, attempt), payload); err != nil {
			return err
		}
		o, err = readOrder(ctx, tx, id)
		return err
	})
	return o, err
}

// captured is the provider's answer that ends a capture: its capture
// object, captured or declined.
type captured struct {
	ID          string `json:"id"`
	Status      string `json:"status"` // "captured" or "declined"
	Amount      int64  `json:"amount"`
	DeclineCode string `json:"decline_code"`
	Replayed    bool   `json:"-"` // the provider answered with the stored response
}

// payments returns the runners of the payment's effects, captures and
// refunds (refund.go): they read PROVIDER_URL, and with
// EFFECT_KEYS_DISABLED (the chaos harness's control run) send no key.
func payments(db platform.DB, cfg platform.Config, log *slog.Logger) ([]platform.Effects, error) {
	if cfg.ProviderURL == "" {
		return []platform.Effects{{Kind: captureKind}, {Kind: refundKind}}, nil // recorded, counted, not called
	}
	p := &paymentProvider{url: strings.TrimSuffix(cfg.ProviderURL, "/"), keys: !cfg.EffectKeysDisabled, token: cfg.ProviderToken, log: log}
	capture, err := captures(db, cfg, p)
	if err != nil {
		return nil, err
	}
	refund, err := refunds(db, cfg, p)
	if err != nil {
		return nil, err
	}
	return []platform.Effects{capture, refund}, nil
}

// captures returns the capture runner.
func captures(db platform.DB, cfg platform.Config, p *paymentProvider) (platform.Effects, error) {
	c := &captureClient{p}
	log := p.log
	r, err := effect.NewRunner(effect.Config[captured]{
		Pool: db.Pool, Standby: db.Standby, Kind: captureKind, Do: c.do, RecordBatch: recordCaptures, Logger: log,
		Workers: cfg.EffectWorkers, Lease: cfg.EffectLease, MinBackoff: cfg.EffectMinBackoff, MaxBackoff: cfg.EffectMaxBackoff,
		// The provider remembers a key for 24 hours; a capture still
		// pending after 23 is handed to a person, never called again.
		MaxAge: 23 * time.Hour,
	})
	if err != nil {
		return platform.Effects{}, err
	}
	return platform.Effects{Kind: captureKind, Run: r.Run, Stats: func() effect.RunnerStats { return r.Stats() }}, nil
}

// paymentProvider calls the payment provider's API.
type paymentProvider struct {
	url   string // PROVIDER_URL, without a trailing slash
	keys  bool   // send the Idempotency-Key (off only in the control run)
	token string // PROVIDER_TOKEN: the provider's API key
	http  http.Client
	log   *slog.Logger
}

// post sends body to the provider's path under key, and returns its
// answer's status, body (at most 1 MiB) and whether the provider replayed
// a stored response.
func (p *paymentProvider) post(ctx context.Context, path, key string, body any) (status int, raw []byte, replay replayed, err error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, nil, replay, effect.Permanent(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, replay, effect.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	if p.keys {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, nil, replay, fmt.Errorf("calling the provider: %w", err)
	}
	defer resp.Body.Close()
	raw, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, replay, fmt.Errorf("reading the provider's answer: %w", err)
	}
	replay = replayed{resp.Header.Get("Idempotent-Replayed") == "true", resp.Header.Get("Original-Request")}
	return resp.StatusCode, raw, replay, nil
}

// replayed says whether the provider answered with a stored response, and
// which request executed it.
type replayed struct {
	yes      bool
	original string
}

// retried reports whether an answer is one a later call may change: the
// key in flight elsewhere, too many requests, a timeout, a 5xx, and the
// answers that mean this side is misconfigured (401, 403, 404: fixed by a
// person, then the call goes on).
func retried(status int) bool {
	switch status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusRequestTimeout, http.StatusTooEarly,
		http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
		return true
	}
	return status >= 500
}

// captureClient makes captures.
type captureClient struct{ *paymentProvider }

// do makes one capture call. A 200 or 402 (declined) ends the effect; the
// answers a later call may change (retried) are retried, visibly
// (effects_retrying, last_error); any other 4xx is a request that can
// never succeed.
func (c *captureClient) do(ctx context.Context, e effect.Effect) (captured, error) {
	var intent capture
	if err := json.Unmarshal(e.Payload, &intent); err != nil {
		return captured{}, effect.Permanent(fmt.Errorf("decoding the capture intent: %w", err))
	}
	status, raw, replay, err := c.post(ctx, "/v1/captures", e.Key, map[string]any{
		"amount": intent.Amount, "currency": intent.Currency, "reference": intent.OrderID, "source": intent.Card,
	})
	if err != nil {
		return captured{}, err
	}
	var out captured
	switch {
	case status == http.StatusOK:
		err = json.Unmarshal(raw, &out)
	case status == http.StatusPaymentRequired: // {"error": {..., "capture": {...}}}
		var declined struct {
			Error struct {
				Capture *captured `json:"capture"`
			} `json:"error"`
		}
		err = json.Unmarshal(raw, &declined)
		if err == nil && declined.Error.Capture != nil {
			out = *declined.Error.Capture
		}
	case retried(status):
		return captured{}, fmt.Errorf("provider: %d %s", status, bytes.TrimSpace(raw))
	default:
		return captured{}, effect.Permanent(fmt.Errorf("provider refused the request: %d %s", status, bytes.TrimSpace(raw)))
	}
	switch {
	case err != nil:
	case out.ID == "":
		err = errors.New("no capture in the answer")
	case status == http.StatusOK && out.Status != "captured",
		status == http.StatusPaymentRequired && out.Status != "declined":
		err = fmt.Errorf("capture %s has status %q", out.ID, out.Status)
	}
	if err != nil {
		return captured{}, fmt.Errorf("provider: %d with an answer this client cannot read: %w", status, err)
	}
	out.Replayed = replay.yes
	if out.Replayed {
		c.log.Info("capture: the provider answered with the stored response; nothing was captured again",
			"key", e.Key, "order_id", intent.OrderID, "capture", out.ID, "attempt", e.Attempt, "original_request", replay.original)
	}
	return out, nil
}

// recordCaptures records the captures' outcomes on their orders, in the
// transaction that ends their effects: one UPDATE of the orders, and one
// outbox insert of the OrderCaptured events.
func recordCaptures(ctx context.Context, tx pgx.Tx, outcomes []effect.Outcome[captured]) error {
	var ids, states []string
	var captureIDs, reasons []*string
	var attempts []int
	for _, o := range outcomes {
		var intent capture
		if err := json.Unmarshal(o.Effect.Payload, &intent); err != nil {
			if o.Err != nil {
				continue // do refused it for the same reason: the effect ends failed, its last_error says why
			}
			return fmt.Errorf("decoding the capture intent of %s: %w", o.Effect.Key, err)
		}
		state, captureID, reason := "captured", &o.Result.ID, (*string)(nil) // a decline has an id too
		switch {
		case o.Err != nil:
			state, captureID = "failed", nil
			msg := o.Err.Error()
			reason = &msg
		case o.Result.Status == "declined":
			state = "declined"
			msg := "the provider declined the card: " + o.Result.DeclineCode
			reason = &msg
		}
		ids, states = append(ids, intent.OrderID), append(states, state)
		captureIDs, reasons = append(captureIDs, captureID), append(reasons, reason)
		attempts = append(attempts, events.CaptureAttempt(o.Effect.Key)) // only the order's current attempt records: its key names it
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `
		UPDATE orders o SET payment = u.state, capture_id = u.capture_id, payment_error = u.reason, payment_at = $5
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $6::int[]) AS u(id, state, capture_id, reason, attempt)
		WHERE o.id = u.id AND o.id = ANY($1) AND o.payment = 'capturing' AND o.capture_attempt = u.attempt
		RETURNING o.id::text, u.state, coalesce(u.capture_id, '')`,
		platform.PlanEachTime, ids, states, captureIDs, reasons, time.Now(), attempts)
	if err != nil {
		return fmt.Errorf("recording %d captures: %w", len(ids), err)
	}
	// Captured, an order has ended: inventory is told, in the same
	// transaction, so that its reserved units become sold ones.
	var msgs []*message.Message
	var id, state, captureID string
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &captureID}, func() error {
		if state != "captured" {
			return nil
		}
		msg, err := events.Message(events.OrderCaptured{
			Envelope: events.NewEnvelope(events.TypeOrderCaptured, id), CaptureID: captureID,
		})
		if err != nil {
			return err
		}
		msgs = append(msgs, msg)
		return nil
	}); err != nil {
		return fmt.Errorf("recording %d captures: %w", len(ids), err)
	}
	if len(msgs) == 0 {
		return nil
	}
	return outbox.PublishTx(ctx, tx, events.TopicOrders, msgs...)
}
