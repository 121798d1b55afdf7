package loadgen_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/loadgen"
)

// TestPaymentOutcomes: each order the client created ends in exactly one of
// the result's lists, by what the client can know of its payment: answered,
// refused, or never answered (which may hide a committed payment, so it is
// not counted as unpaid). A refusal stops the load, but for one: an order
// the client was told was created and the service no longer knows (a
// failover lost it) is recorded for the checker, and the load goes on.
func TestPaymentOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                  string
		pay                   http.HandlerFunc
		paid, unpaid, unknown int
		stops                 bool // the run returns an error
	}{
		{"answered", func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(loadgen.Order{ID: r.PathValue("id"), Status: "paid"}) //nolint:errcheck
		}, 1, 0, 0, false},
		{"refused", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "order is not payable", http.StatusConflict)
		}, 0, 1, 0, true},
		{"vanished", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "order not found", http.StatusNotFound)
		}, 0, 1, 0, false},
		{"never answered", func(w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done() // as a replica that committed and died before answering, until the run ends
		}, 0, 0, 1, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mux := http.NewServeMux()
			mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				json.NewEncoder(w).Encode(loadgen.Order{ID: "order-1", Status: "created"}) //nolint:errcheck
			})
			mux.HandleFunc("POST /orders/{id}/pay", tc.pay)
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)

			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			c := loadgen.NewClient([]string{srv.URL}, []string{srv.URL})
			res, err := loadgen.Run(ctx, c, loadgen.SKUs(1), loadgen.Plan{Orders: 1, Concurrency: 1})
			if tc.stops {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
			}
			require.Len(t, res.Paid, tc.paid)
			require.Len(t, res.Unpaid, tc.unpaid)
			require.Len(t, res.Unknown, tc.unknown)

			client := res.Client()
			require.Len(t, client.Paid, tc.paid)
			require.Equal(t, res.Unpaid, client.Unpaid)
			require.Equal(t, res.Unknown, client.Unknown)
			for _, ids := range [][]string{client.Paid, client.Unpaid, client.Unknown} {
				for _, id := range ids {
					require.Equal(t, "order-1", id)
				}
			}
		})
	}
}
