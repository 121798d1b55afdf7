package main

// Refunding a captured payment. An order is captured once inventory
// reserved it; if it turns out inventory never did (a wrong answer slipped
// through: the auditor's answers-disagree), the customer is owed the money
// back. POST /orders/{id}/payment/refund, by the auditor or a person:
//
//  1. in one transaction the order ends rejected, with the reason, its
//     payment moves from captured to refunding, and the refund is recorded
//     as an effect (pkg/effect) under the key refund-<order id>: an order
//     is refunded once, whole, so asking again changes nothing;
//  2. the runner calls POST /v1/refunds with that key, retried with
//     backoff; a call whose answer was lost is repeated with the same key
//     and the provider answers with the stored refund instead of refunding
//     again;
//  3. the outcome is recorded in the transaction that ends the effect:
//     refunded (the provider's refund id), or refund_failed with the
//     reason (a state a person acts on).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// refundKind is the effect kind of a refund.
const refundKind = "refund"

// maxRefundReason bounds the reason a refund is asked with.
const maxRefundReason = 500

// refund is the intent: which capture to give back, for which order.
type refund struct {
	OrderID string `json:"order_id"`
	Capture string `json:"capture"`
	Amount  int64  `json:"amount"`
	Reason  string `json:"reason"`
}

// errRefundRefused says why an order cannot be refunded.
type errRefundRefused struct{ reason string }

func (e errRefundRefused) Error() string { return "refund refused: " + e.reason }

// requestRefund refunds order id's captured payment: the order ends
// rejected with reason, and the refund is recorded, in one transaction.
// It is the remedy for a capture inventory never backed: refunding an
// order inventory reserved or sold leaves its units where they are, and
// the auditor reports the order (answers-disagree, sale-without-capture).
// An order already refunding or refunded is answered as it is (asking twice
// refunds once); any other order is refused (errRefundRefused): only a
// captured payment is refunded.
func requestRefund(ctx context.Context, db platform.DB, id, reason string) (Order, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return Order{}, errNotFound
	}
	id = u.String()
	var o Order
	err = db.Write(ctx, func(tx pgx.Tx) error {
		r := refund{Reason: reason}
		err := tx.QueryRow(ctx, `
			UPDATE orders SET status = 'rejected', reject_reason = $2, payment = 'refunding', refund_at = now()
			WHERE id = $1 AND payment = 'captured'
			RETURNING id::text, capture_id, coalesce(amount, 0)`, platform.PlanEachTime, id, "refunded: "+reason).
			Scan(&r.OrderID, &r.Capture, &r.Amount)
		if errors.Is(err, pgx.ErrNoRows) {
			cur, rerr := readOrder(ctx, tx, id)
			switch {
			case rerr != nil:
				return rerr
			case cur.Payment == "refunding" || cur.Payment == "refunded":
				o = cur
				return nil
			default:
				return errRefundRefused{fmt.Sprintf("order %s's payment is %s: only a captured payment is refunded", id, orNone(cur.Payment))}
			}
		}
		if err != nil {
			return fmt.Errorf("refunding: %w", err)
		}
		payload, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if _, err := effect.EnqueueTx(ctx, tx, refundKind, events.RefundKey(id), payload); err != nil {
			return err
		}
		o, err = readOrder(ctx, tx, id)
		return err
	})
	return o, err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// refunded is the provider's answer that ends a refund.
type refunded struct {
	ID     string `json:"id"`
	Status string `json:"status"` // "succeeded"
	// Already: the provider refused the refund because the capture was
	// refunded already (under a key it no longer remembers): nothing is
	// owed, and its refund id is not known here.
	Already bool `json:"-"`
}

// refunds returns the refund runner.
func refunds(db platform.DB, cfg platform.Config, p *paymentProvider) (platform.Effects, error) {
	c := &refundClient{p}
	r, err := effect.NewRunner(effect.Config[refunded]{
		Pool: db.Pool, Standby: db.Standby, Kind: refundKind, Do: c.do, RecordBatch: recordRefunds, Logger: p.log,
		Workers: cfg.EffectWorkers, Lease: cfg.EffectLease, MinBackoff: cfg.EffectMinBackoff, MaxBackoff: cfg.EffectMaxBackoff,
		MaxAge: 23 * time.Hour, // the provider remembers a key for 24 hours
	})
	if err != nil {
		return platform.Effects{}, err
	}
	return platform.Effects{Kind: refundKind, Run: r.Run, Stats: func() effect.RunnerStats { return r.Stats() }}, nil
}

// refundClient makes refunds.
type refundClient struct{ *paymentProvider }

// do makes one refund call. A 200 ends the effect refunded, and so does a
// 400 charge_already_refunded (the money is back); the answers a later
// call may change (retried: a 404 without resource_missing among them)
// are retried; a 404 resource_missing (no such capture) and any other 4xx
// end it failed.
func (c *refundClient) do(ctx context.Context, e effect.Effect) (refunded, error) {
	var intent refund
	if err := json.Unmarshal(e.Payload, &intent); err != nil {
		return refunded{}, effect.Permanent(fmt.Errorf("decoding the refund intent: %w", err))
	}
	status, raw, replay, err := c.post(ctx, "/v1/refunds", e.Key, map[string]any{"capture": intent.Capture, "reason": intent.Reason})
	if err != nil {
		return refunded{}, err
	}
	var apiErr struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &apiErr) // a body that is no error says nothing here
	var out refunded
	switch {
	case status == http.StatusOK:
		if err := json.Unmarshal(raw, &out); err != nil || out.ID == "" || out.Status != "succeeded" {
			return refunded{}, fmt.Errorf("provider: 200 with an answer this client cannot read: %s", bytes.TrimSpace(raw))
		}
	case status == http.StatusBadRequest && apiErr.Error.Code == "charge_already_refunded":
		out.Already = true
	case status == http.StatusNotFound && apiErr.Error.Code == "resource_missing":
		return refunded{}, effect.Permanent(fmt.Errorf("the provider has no capture %s: %s", intent.Capture, bytes.TrimSpace(raw)))
	case retried(status):
		return refunded{}, fmt.Errorf("provider: %d %s", status, bytes.TrimSpace(raw))
	default:
		return refunded{}, effect.Permanent(fmt.Errorf("provider refused the refund: %d %s", status, bytes.TrimSpace(raw)))
	}
	if replay.yes {
		c.log.Info("refund: the provider answered with the stored response; nothing was refunded again",
			"key", e.Key, "order_id", intent.OrderID, "refund", out.ID, "attempt", e.Attempt, "original_request", replay.original)
	}
	return out, nil
}

// recordRefunds records the refunds' outcomes on their orders, in the
// transaction that ends their effects, in one statement.
func recordRefunds(ctx context.Context, tx pgx.Tx, outcomes []effect.Outcome[refunded]) error {
	var ids, states []string
	var refundIDs, reasons []*string
	for _, o := range outcomes {
		var intent refund
		if err := json.Unmarshal(o.Effect.Payload, &intent); err != nil {
			if o.Err != nil {
				continue // do refused it for the same reason: the effect ends failed, its last_error says why
			}
			return fmt.Errorf("decoding the refund intent of %s: %w", o.Effect.Key, err)
		}
		state, refundID, reason := "refunded", &o.Result.ID, (*string)(nil)
		switch {
		case o.Err != nil:
			state, refundID = "refund_failed", nil
			msg := o.Err.Error()
			reason = &msg
		case o.Result.Already:
			refundID = nil
			msg := "the provider says the capture was refunded already"
			reason = &msg
		}
		ids, states = append(ids, intent.OrderID), append(states, state)
		refundIDs, reasons = append(refundIDs, refundID), append(reasons, reason)
	}
	if len(ids) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `
		UPDATE orders o SET payment = u.state, refund_id = u.refund_id, payment_error = u.reason
		FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]) AS u(id, state, refund_id, reason)
		WHERE o.id = u.id AND o.id = ANY($1) AND o.payment = 'refunding'`,
		platform.PlanEachTime, ids, states, refundIDs, reasons)
	if err != nil {
		return fmt.Errorf("recording %d refunds: %w", len(ids), err)
	}
	return nil
}

// validReason accepts a refund's reason: printable text, 1 to
// maxRefundReason bytes.
func validReason(s string) error {
	switch {
	case s == "":
		return errors.New("a reason is required")
	case len(s) > maxRefundReason:
		return fmt.Errorf("the reason is %d bytes, more than %d", len(s), maxRefundReason)
	case !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }):
		return errors.New("the reason must be printable text")
	}
	return nil
}
