package main

// Repair: what the domain can put right, it does. One breach has a remedy
// that is the domain's own: a payment captured for an order inventory
// rejected (answers-disagree) is owed back to the customer, so the auditor
// asks orders to refund it (POST /orders/{id}/payment/refund, ORDERS_API_URL).
// Orders makes the refund exactly once (one effect per order, under the
// key refund-<order id>, and the provider's idempotency), so asking again,
// after a kill between the request and the auditor's record of it, changes
// nothing. Every other breach stays a finding of its kind: a named state
// with a runbook (docs/operate.md) for a person.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// ordersAPI asks orders for repairs.
type ordersAPI struct {
	url   string // ORDERS_API_URL, without a trailing slash
	token string // ORDERS_API_TOKEN: orders' HTTP_TOKEN
	http  *http.Client
}

func newOrdersAPI(base, token string) *ordersAPI {
	if base == "" {
		return nil
	}
	return &ordersAPI{url: strings.TrimSuffix(base, "/"), token: token, http: &http.Client{Timeout: 10 * time.Second}}
}

// repairOrder is the orders check's Repair: it refunds a capture made for
// an order inventory rejected, and leaves every other finding to a person.
// It reads the order again first: only an order orders holds reserved and
// captured, that inventory rejected and reserved and sold nothing of, is
// refunded; one still capturing is asked about again next round.
func (d domain) repairOrder(ctx context.Context, f audit.Finding) (string, error) {
	if f.Kind != KindAnswersDisagree {
		return "", nil
	}
	views, err := d.readOrders(ctx, []string{f.Entity})
	if err != nil {
		return "", err
	}
	v := views[f.Entity]
	if !refundable(v) {
		return "", nil
	}
	return d.repair.refund(ctx, f.Entity, refundReason)
}

// refundable reports whether v is a capture inventory never backed.
func refundable(v *orderView) bool {
	return v.found && v.status == "reserved" && v.payment == "captured" && v.decision == "rejected" &&
		len(v.reserved) == 0 && len(v.sold) == 0
}

// refund asks orders to refund order id's capture, and says what orders
// answered.
func (o *ordersAPI) refund(ctx context.Context, id, reason string) (string, error) {
	body, _ := json.Marshal(map[string]string{"reason": reason})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url+"/orders/"+url.PathEscape(id)+"/payment/refund", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if o.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.token)
	}
	resp, err := o.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("asking orders for the refund: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("orders refused the refund: %d %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var order struct {
		Status  string `json:"status"`
		Payment string `json:"payment"`
	}
	if err := json.Unmarshal(raw, &order); err != nil {
		return "", fmt.Errorf("orders' answer to the refund: %w", err)
	}
	return fmt.Sprintf("refund asked of orders: the order is now %s, its payment %s", order.Status, order.Payment), nil
}

// refundReason is what orders keeps as the reason of an order the auditor
// had refunded: it ends with judge.RepairMark, by which the chaos judge
// knows the auditor asked even when the auditor's record of it was lost.
const refundReason = "inventory rejected the order; its capture is given back (audit: answers-disagree)"
