package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// TestRepairRefundsWhatInventoryRejected: orders captured an order
// inventory rejected (a wrong answer signed as inventory's): the auditor
// asks orders' API, with its token, to refund it, once, and records what
// orders answered on the finding, which resolves once the order says
// rejected; asked while orders refuses (the capture's record in flight),
// it asks again next round. An order reserved and declined that inventory
// rejected owes nothing: its finding stays, for a person, and orders is
// never asked. Orders here is a stand-in that writes what orders' refund
// writes (chaos/e2e drives the real one).
func TestRepairRefundsWhatInventoryRejected(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.healthy()
	captured := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	declined := w.add(order{status: "reserved", payment: "declined", lines: c1, decision: "rejected"})
	busy := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})

	var mu sync.Mutex
	asked := map[string]int{}
	refusing := true
	orders := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/orders/"), "/payment/refund")
		var req struct{ Reason string }
		if r.Method != http.MethodPost || r.Header.Get("Authorization") != "Bearer orders-token" ||
			json.NewDecoder(r.Body).Decode(&req) != nil || req.Reason == "" {
			http.Error(rw, "bad request", http.StatusBadRequest)
			return
		}
		asked[id]++
		if id == busy && refusing {
			http.Error(rw, `{"error": "refund refused: order's payment is capturing"}`, http.StatusConflict)
			return
		}
		w.exec(w.orders, `UPDATE orders SET status = 'rejected', reject_reason = $2, payment = 'refunding', refund_at = now() WHERE id = $1 AND payment = 'captured'`, id, req.Reason)
		rw.WriteHeader(http.StatusAccepted)
		rw.Write([]byte(`{"id": "` + id + `", "status": "rejected", "payment": "refunding"}`)) //nolint:errcheck
	}))
	t.Cleanup(orders.Close)

	grace := time.Minute
	a, err := audit.New(w.state, audit.Config{Grace: grace, Batch: 3},
		domain{orders: w.orders, inventory: w.inventory, grace: grace, repair: newOrdersAPI(orders.URL+"/", "orders-token")}.checks()...)
	require.NoError(t, err)
	repairs := func() map[string]string {
		recs, err := audit.ListFindings(t.Context(), w.state, audit.ListOptions{All: true})
		require.NoError(t, err)
		out := map[string]string{}
		for _, r := range recs {
			out[r.Entity] = r.Kind + " open=" + map[bool]string{true: "yes", false: "no"}[r.Open()] + " repair=" + r.Repair
			if r.RepairError != "" {
				out[r.Entity] += " failed=" + r.RepairError
			}
		}
		return out
	}

	// Two rounds: orders' refusal ends a round's repairs, and the next
	// asks about the others first.
	w.round(a)
	w.round(a)
	got := repairs()
	require.Contains(t, got[captured], "repair=refund asked of orders: the order is now rejected, its payment refunding")
	require.Equal(t, "answers-disagree open=yes repair=", got[declined])
	require.Equal(t, `answers-disagree open=yes repair= failed=orders refused the refund: 409 {"error": "refund refused: order's payment is capturing"}`, got[busy])

	mu.Lock()
	refusing = false
	mu.Unlock()
	w.round(a)
	w.round(a)
	require.Equal(t, map[string]string{
		captured: "answers-disagree open=no repair=refund asked of orders: the order is now rejected, its payment refunding",
		declined: "answers-disagree open=yes repair=",
		busy:     "answers-disagree open=no repair=refund asked of orders: the order is now rejected, its payment refunding",
	}, repairs())
	mu.Lock()
	require.Equal(t, 1, asked[captured], "a refund orders took is not asked for again")
	require.GreaterOrEqual(t, asked[busy], 2, "a refund orders refused is asked for again")
	require.NotContains(t, asked, declined, "nothing is owed on a declined order")
	mu.Unlock()
	var reason string
	require.NoError(t, w.orders.QueryRow(t.Context(), `SELECT reject_reason FROM orders WHERE id = $1`, captured).Scan(&reason))
	require.Contains(t, reason, "inventory rejected the order")
}

// TestRefundOutcomeFollowed: once the auditor's repair asked for a
// refund, the disagreement resolves (the order now says rejected), and the
// refunds check follows the refund to its end: one the provider refused
// for good is refund-failed, one still pending past the grace period is
// refund-pending, one refunded is nothing.
func TestRefundOutcomeFollowed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	failed := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	stuck := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	done := w.add(order{status: "reserved", payment: "captured", lines: c1, decision: "rejected"})
	grace := time.Minute
	checks := domain{orders: w.orders, inventory: w.inventory, grace: grace}.checks()
	checks[0].Repair = func(ctx context.Context, f audit.Finding) (string, error) {
		// what orders' requestRefund writes
		w.exec(w.orders, `UPDATE orders SET status = 'rejected', reject_reason = 'refunded: x', payment = 'refunding', refund_at = now() WHERE id = $1 AND payment = 'captured'`, f.Entity)
		return "refund asked", nil
	}
	a, err := audit.New(w.state, audit.Config{Grace: grace, Batch: 3}, checks...)
	require.NoError(t, err)
	w.round(a)
	require.Empty(t, w.round(a), "the disagreements repaired and resolved")
	w.exec(w.orders, `UPDATE orders SET payment = 'refund_failed', payment_error = 'provider refused' WHERE id = $1`, failed)
	w.exec(w.orders, `UPDATE orders SET payment = 'refunded', refund_id = 're_1' WHERE id = $1`, done)
	w.exec(w.orders, `UPDATE orders SET refund_at = now() - interval '1 hour' WHERE id = ANY($1::uuid[])`, []string{failed, stuck, done})
	require.Equal(t, sorted("refunds "+failed+" "+KindRefundFailed, "refunds "+stuck+" "+KindRefundPending), w.round(a))
}
