package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// TestWrongAnswerRefunded: inventory with a bug answers "reserved", signed
// with its real key, for an order it cannot reserve (inventory is down
// when the order is paid, and the SKU is one it does not stock). Orders
// applies it and captures the payment; inventory, back, rejects the
// order; the two disagree. The auditor finds answers-disagree and asks
// orders to refund the capture: the order ends rejected and refunded, the
// provider holds one refund of the whole capture under the key
// refund-<order id>, and the finding resolves with its repair recorded.
// Killed: orders is killed with SIGKILL after the provider refunded and
// before orders recorded it; restarted, it calls again with the same key
// and the provider answers with the stored refund: still one refund.
func TestWrongAnswerRefunded(t *testing.T) {
	t.Parallel()
	for _, killed := range []bool{false, true} {
		t.Run(fmt.Sprintf("Killed=%t", killed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, system.Options{AuditGrace: 2 * time.Second, EnvFor: map[string][]string{"orders": {"EFFECT_LEASE=2s"}}})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var restarts atomic.Int64
			b.sys.Supervise(ctx, func() time.Duration { return 100 * time.Millisecond }, func(*procs.Proc) { restarts.Add(1) })
			inventory := b.sys.Procs["inventory"][0]
			require.NoError(t, inventory.Stop(10*time.Second))

			lines := []events.Line{{SKU: "not-stocked-" + uuid.NewString()[:8], Quantity: 1}}
			o, err := b.sys.Client.CreateOrder(ctx, lines)
			require.NoError(t, err)
			_, err = b.sys.Client.Pay(ctx, o.ID)
			require.NoError(t, err)
			msg, err := events.Message(events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, o.ID), Lines: lines})
			require.NoError(t, err)
			b.sys.SignAsProducer(events.TopicInventory, msg)
			publish(t, b, events.TopicInventory, msg)

			orders := b.sys.Pools["orders"]
			column := func(sql string) string {
				var v string
				require.NoError(t, orders.QueryRow(ctx, `SELECT coalesce(`+sql+`, '') FROM orders WHERE id = $1`, o.ID).Scan(&v))
				return v
			}
			require.Eventually(t, func() bool { return column("payment") == "captured" }, time.Minute, 50*time.Millisecond,
				"the wrong answer applied and the payment captured")
			captureID := column("capture_id")
			if killed {
				arm(t, ctx, "http://"+b.sys.Procs["orders"][0].Addr, failpoint.AfterEffectBeforeRecord)
			}
			require.NoError(t, inventory.Start())

			require.Eventually(t, func() bool { return column("payment") == "refunded" }, 2*time.Minute, 100*time.Millisecond,
				"refunded (payment %s, %s)", column("payment"), column("payment_error"))
			require.Equal(t, "rejected", column("status"))
			require.Contains(t, column("reject_reason"), "inventory rejected the order")
			var decision string
			require.NoError(t, b.sys.Pools["inventory"].QueryRow(ctx, `SELECT decision FROM decisions WHERE order_id = $1`, o.ID).Scan(&decision))
			require.Equal(t, "rejected", decision)

			ledger := b.sys.Pools["provider"]
			var refunds int
			var refunded, capturedAmount int64
			var refundID, key string
			require.NoError(t, ledger.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0), coalesce(min(id), ''), coalesce(min(idempotency_key), '')
				FROM refunds WHERE capture_id = $1`, captureID).Scan(&refunds, &refunded, &refundID, &key))
			require.NoError(t, ledger.QueryRow(ctx, `SELECT sum(amount) FROM captures WHERE reference = $1 AND status = 'captured'`, o.ID).Scan(&capturedAmount))
			require.Equal(t, 1, refunds, "refunds of the capture")
			require.Equal(t, capturedAmount, refunded, "the whole capture given back")
			require.Equal(t, refundID, column("refund_id"), "orders recorded the provider's refund (a second call under another key is refused: already refunded)")
			require.Equal(t, events.RefundKey(o.ID), key)

			var rec audit.Record
			require.Eventually(t, func() bool {
				recs, err := audit.ListFindings(ctx, b.sys.Pools["audit"], audit.ListOptions{All: true, Check: "orders", Limit: 1000})
				require.NoError(t, err)
				for _, r := range recs {
					if r.Entity == o.ID && r.Kind == "answers-disagree" {
						rec = r
					}
				}
				return rec.Entity != "" && !rec.Open()
			}, time.Minute, 100*time.Millisecond, "the auditor's finding resolved")
			require.Contains(t, rec.Repair, "refund asked of orders")
			if killed {
				require.GreaterOrEqual(t, restarts.Load(), int64(1), "orders was killed in the refund's window")
			}
		})
	}
}

// arm arms window in the service at base for its next hit (POST
// /debug/crash, a failpoint build's).
func arm(t *testing.T, ctx context.Context, base string, window failpoint.Name) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/debug/crash?window="+string(window), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
