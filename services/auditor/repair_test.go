package main

import (
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

	w.round(a)
	require.Equal(t, map[string]string{
		captured: "answers-disagree open=yes repair=refund asked of orders: the order is now rejected, its payment refunding",
		declined: "answers-disagree open=yes repair=",
		busy:     `answers-disagree open=yes repair= failed=orders refused the refund: 409 {"error": "refund refused: order's payment is capturing"}`,
	}, repairs())

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
	require.Equal(t, map[string]int{captured: 1, busy: 2}, asked, "each refund asked for until orders took it, then never again; the declined order's never")
	mu.Unlock()
	var reason string
	require.NoError(t, w.orders.QueryRow(t.Context(), `SELECT reject_reason FROM orders WHERE id = $1`, captured).Scan(&reason))
	require.Contains(t, reason, "inventory rejected the order")
}
