package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
)

// TestEnvelopeDisagreementsRefused: orders with a bug publishes, signed
// with its real key, events whose record says otherwise than their
// payload: an OrderPaid keyed under another order, one whose type header
// names another type, and an InventoryReserved (inventory's type) on its
// own topic. Inventory's inbox quarantines each as invalid, naming the
// disagreement, before the handler runs: no reservation, no decision for
// the orders they concern; the good OrderPaid sent beside them is applied.
func TestEnvelopeDisagreementsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, system.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	paid := func(orderID string) *message.Message {
		msg, err := events.Message(events.OrderPaid{Envelope: events.NewEnvelope(events.TypeOrderPaid, orderID),
			Lines: []events.Line{{SKU: b.skus[0], Quantity: 1}}, PaidAt: time.Now().UTC()})
		require.NoError(t, err)
		return msg
	}
	type sent struct {
		orderID, reason string // reason "": must be applied
		msg             *message.Message
	}
	var cases []sent
	{
		id := uuid.NewString()
		msg := paid(id)
		msg.Metadata.Set(outbox.KeyMetadata, uuid.NewString()) // keyed under another order
		cases = append(cases, sent{id, `partition key`, msg})
	}
	{
		id := uuid.NewString()
		msg := paid(id)
		msg.Metadata.Set(outbox.TypeMetadata, events.TypeOrderCaptured)
		cases = append(cases, sent{id, `type header "OrderCaptured", the payload's type is "OrderPaid"`, msg})
	}
	{
		id := uuid.NewString()
		msg, err := events.Message(events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, id),
			Lines: []events.Line{{SKU: b.skus[0], Quantity: 1}}})
		require.NoError(t, err)
		cases = append(cases, sent{id, `read from topic "orders.events", its type "InventoryReserved" travels on ["inventory.events"]`, msg})
	}
	good := uuid.NewString()
	cases = append(cases, sent{good, "", paid(good)})
	for _, c := range cases {
		b.sys.SignAsProducer(events.TopicOrders, c.msg)
		publish(t, b, events.TopicOrders, c.msg)
	}

	inv := b.sys.Pools["inventory"]
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, inv.QueryRow(ctx, `SELECT count(*) FROM decisions WHERE order_id = $1`, good).Scan(&n))
		return n == 1
	}, time.Minute, 50*time.Millisecond, "the good OrderPaid decided")
	for _, c := range cases[:len(cases)-1] {
		var reason string
		require.Eventually(t, func() bool {
			return inv.QueryRow(ctx, `SELECT reason FROM inbox_quarantine WHERE consumer = 'inventory' AND kind = 'invalid' AND message_id = $1`,
				c.msg.UUID).Scan(&reason) == nil
		}, time.Minute, 50*time.Millisecond, "%s quarantined", c.reason)
		require.Contains(t, reason, "the record disagrees with its payload: ")
		require.Contains(t, reason, c.reason)
		var decided, reserved int
		require.NoError(t, inv.QueryRow(ctx, `SELECT (SELECT count(*) FROM decisions WHERE order_id = $1),
			(SELECT count(*) FROM reservations WHERE order_id = $1)`, c.orderID).Scan(&decided, &reserved))
		require.Zero(t, decided+reserved, "%s: applied", c.reason)
	}
}
