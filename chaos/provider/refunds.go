package provider

// Refunds: POST /v1/refunds gives back all or part of a capture, once per
// Idempotency-Key, through the same steps as a capture (servePost). Its
// execution is one transaction that locks the capture row (FOR UPDATE),
// sums the capture's refunds, and writes the refund, or decides the
// refusal, with the response stored under the key: two refunds of one
// capture under different keys are serialized on its row, so its refunds
// never sum to more than its amount, and a retry under the same key gets
// the stored answer, never a second refund.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// Refund is a refund of a capture: what POST /v1/refunds answers (200),
// and what GET /v1/refunds lists.
type Refund struct {
	ID             string `json:"id"`
	Object         string `json:"object"` // "refund"
	Capture        string `json:"capture"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	Reference      string `json:"reference"` // the capture's: the merchant's order id
	Reason         string `json:"reason,omitempty"`
	Status         string `json:"status"` // RefundSucceeded
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	Created        int64  `json:"created"` // Unix seconds
}

// RefundSucceeded is the status of every refund: a refund is executed at
// once or not at all.
const RefundSucceeded = "succeeded"

// Codes of the refusals a refund's execution decides (400, or 404 for
// resource_missing), stored under the key like a refund.
const (
	CodeResourceMissing       = "resource_missing"        // 404: no such capture
	CodeCaptureNotRefundable  = "capture_not_refundable"  // the capture was declined
	CodeChargeAlreadyRefunded = "charge_already_refunded" // nothing left to refund
	CodeAmountTooLarge        = "amount_too_large"        // more than what is left
)

// RefundList is what GET /v1/refunds answers.
type RefundList struct {
	Object  string   `json:"object"` // "list"
	Data    []Refund `json:"data"`
	HasMore bool     `json:"has_more"`
}

// createRefund answers POST /v1/refunds.
func (p *Provider) createRefund(w http.ResponseWriter, r *http.Request) {
	p.servePost(w, r, func(body []byte) (postCall, error) {
		req, err := parseRefundRequest(body)
		if err != nil {
			return postCall{}, err
		}
		attrs := []any{"capture", req.Capture}
		if req.Amount != nil {
			attrs = append(attrs, "amount", *req.Amount)
		}
		return postCall{what: "refund", params: req, attrs: attrs,
			execute: func(ctx context.Context, key, token, reqID string) (result, error) {
				return p.executeRefund(ctx, req, key, token, reqID)
			}}, nil
	})
}

// executeRefund refunds req, or decides why not, in one transaction that
// stores the response under key (if any): only if token still holds the
// key (errLostKey otherwise, and nothing is written).
func (p *Provider) executeRefund(ctx context.Context, req RefundRequest, key, token, reqID string) (result, error) {
	now := p.cfg.Now()
	res, err := p.commit(ctx, key, token, now, func(tx pgx.Tx) (result, error) {
		return refundTx(ctx, tx, req, key, reqID, now)
	})
	if err != nil && !errors.Is(err, errLostKey) {
		err = fmt.Errorf("storing the refund and its response: %w", err)
	}
	return res, err
}

// refundTx is the work of executeRefund inside its transaction.
func refundTx(ctx context.Context, tx pgx.Tx, req RefundRequest, key, reqID string, now time.Time) (result, error) {
	refuse := func(status int, code, param, msg string) (result, error) {
		return result{status: status, attrs: []any{"refused", code},
			body: marshal(ErrorBody{APIError{Type: "invalid_request_error", Code: code, Param: param, Message: msg}})}, nil
	}
	var captured, refunded int64
	var currency, reference, status string
	// The lock serializes the refunds of one capture; the sum, a statement
	// of its own, then sees every refund committed before the lock was ours
	// (read committed: a new snapshot per statement).
	err := tx.QueryRow(ctx, `SELECT amount, currency, reference, status FROM captures WHERE id = $1 FOR UPDATE`,
		req.Capture).Scan(&captured, &currency, &reference, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		return refuse(http.StatusNotFound, CodeResourceMissing, "capture", "no such capture: "+truncate(req.Capture))
	}
	if err != nil {
		return result{}, fmt.Errorf("locking the capture: %w", err)
	}
	if status != StatusCaptured {
		return refuse(http.StatusBadRequest, CodeCaptureNotRefundable, "capture", "the capture was "+status+": there is nothing to refund")
	}
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(amount), 0) FROM refunds WHERE capture_id = $1`, req.Capture).Scan(&refunded); err != nil {
		return result{}, fmt.Errorf("summing the refunds: %w", err)
	}
	left := captured - refunded
	amount := left
	if req.Amount != nil {
		amount = *req.Amount
	}
	switch {
	case left <= 0:
		return refuse(http.StatusBadRequest, CodeChargeAlreadyRefunded, "capture", "the capture has already been refunded in full")
	case amount > left:
		return refuse(http.StatusBadRequest, CodeAmountTooLarge, "amount", fmt.Sprintf("amount %d is more than the %d left to refund", amount, left))
	}
	rf := Refund{ID: newID("re_"), Object: "refund", Capture: req.Capture, Amount: amount, Currency: currency,
		Reference: reference, Reason: req.Reason, Status: RefundSucceeded, IdempotencyKey: key, Created: now.Unix()}
	if _, err := tx.Exec(ctx, `INSERT INTO refunds
		(id, capture_id, amount, currency, reference, reason, idempotency_key, request_id, created_at)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), NULLIF($7, ''), $8, $9)`,
		rf.ID, rf.Capture, rf.Amount, rf.Currency, rf.Reference, rf.Reason, key, reqID, now); err != nil {
		return result{}, fmt.Errorf("inserting the refund: %w", err)
	}
	return result{status: http.StatusOK, body: marshal(rf), refundID: rf.ID,
		attrs: []any{"refund", rf.ID, "refunded", rf.Amount, "left", left - amount}}, nil
}

func (p *Provider) getRefund(w http.ResponseWriter, r *http.Request) {
	getByID(p, w, r, "refund", p.queryRefunds)
}

// listRefunds answers GET /v1/refunds?capture=… or ?reference=… (exactly
// one): the refunds of one capture or of one order, oldest first (at most
// 1,000).
func (p *Provider) listRefunds(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	capture, reference := q.Get("capture"), q.Get("reference")
	where, arg, param := `WHERE capture_id = $1`, capture, "capture"
	switch {
	case (capture == "") == (reference == ""):
		writeError(w, http.StatusBadRequest, APIError{Type: "invalid_request_error", Param: "capture",
			Message: "exactly one of capture and reference is required"})
		return
	case reference != "":
		where, arg, param = `WHERE reference = $1`, reference, "reference"
	}
	if !textParam(w, param, arg) {
		return
	}
	list, more, err := p.queryRefunds(r.Context(), where, 1000, arg)
	if err != nil {
		p.internalError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, RefundList{Object: "list", Data: list, HasMore: more})
}

// queryRefunds returns up to limit refunds matching where (with its one
// argument), in seq order, and whether there were more.
func (p *Provider) queryRefunds(ctx context.Context, where string, limit int, arg any) ([]Refund, bool, error) {
	rows, err := p.pool.Query(ctx, `SELECT id, capture_id, amount, currency, reference,
		coalesce(reason, ''), coalesce(idempotency_key, ''), created_at
		FROM refunds `+where+` ORDER BY seq LIMIT $2`, arg, limit+1)
	return collectPage(rows, err, limit, func(row pgx.CollectableRow) (Refund, error) {
		rf := Refund{Object: "refund", Status: RefundSucceeded}
		var created time.Time
		err := row.Scan(&rf.ID, &rf.Capture, &rf.Amount, &rf.Currency, &rf.Reference, &rf.Reason, &rf.IdempotencyKey, &created)
		rf.Created = created.Unix()
		return rf, err
	})
}
