package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// TestForgedAnswerRefused: anyone who can write to inventory.events writes
// an InventoryRejected under a fresh message id for an order that is paid
// and not yet answered (inventory is down). The inbox has never seen the id
// and the domain guard applies an order's first answer, so without
// signatures the forgery settles the order as rejected (the control). With
// signed events (SIGNING_KEY, TRUSTED_KEYS) orders' inbox quarantines the
// unsigned record, and a record signed with a key orders does not trust,
// as not authenticated; once inventory is back, its real answer reserves
// the order.
func TestForgedAnswerRefused(t *testing.T) {
	t.Parallel()
	for _, signed := range []bool{true, false} {
		t.Run(fmt.Sprintf("Signed=%t", signed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, system.Options{Unsigned: !signed})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			inventory := b.sys.Procs["inventory"][0]
			require.NoError(t, inventory.Stop(10*time.Second))

			o, err := b.sys.Client.CreateOrder(ctx, []events.Line{{SKU: b.skus[0], Quantity: 1}})
			require.NoError(t, err)
			_, err = b.sys.Client.Pay(ctx, o.ID)
			require.NoError(t, err)

			if signed && !b.sys.Kafka.Authenticated() {
				t.Log("KAFKA_BROKERS names a broker that asks for no login: the broker's refusals are not tested")
			}
			if signed && b.sys.Kafka.Authenticated() {
				// Before the inbox sees anything: the broker refuses a
				// writer without the right to the topic. Orders' own
				// principal may not write inventory's topic, a principal
				// with no grants may write nothing, and a client without a
				// login is not let in at all.
				nobody, err := b.sys.Kafka.AddPrincipal(ctx, "nobody-"+uuid.NewString()[:8])
				require.NoError(t, err)
				for name, login := range map[string]kafkaconf.Credentials{"orders": b.sys.Logins["orders"], "no grants": nobody} {
					err := publishAs(b, login, events.TopicInventory, forgedAnswer(t, o.ID))
					require.ErrorIs(t, err, sarama.ErrTopicAuthorizationFailed, "%s wrote %s", name, events.TopicInventory)
				}
				require.Error(t, publishAs(b, kafkaconf.Credentials{}, events.TopicInventory, forgedAnswer(t, o.ID)), "a client without a login wrote")
				require.NoError(t, publishAs(b, b.sys.Logins["inventory"], events.TopicInventory, forgedAnswer(t, o.ID)),
					"the topic's producer may write it (its unsigned record must then meet the inbox)")
			}
			unsigned, otherKey := forgedAnswer(t, o.ID), forgedAnswer(t, o.ID)
			otherKey.Metadata.Set("signature_key_id", "inventory-1")
			otherKey.Metadata.Set("signature", "bm90IGEgcmVhbCBzaWduYXR1cmUgYXQgYWxsLCBqdXN0IGJ5dGVzIQ")
			publish(t, b, events.TopicInventory, unsigned, otherKey)

			status := func() (string, string) {
				var status, reason string
				require.NoError(t, b.sys.Pools["orders"].QueryRow(ctx,
					`SELECT status, coalesce(reject_reason, '') FROM orders WHERE id = $1`, o.ID).Scan(&status, &reason))
				return status, reason
			}
			if !signed {
				require.Eventually(t, func() bool { s, _ := status(); return s == "rejected" }, time.Minute, 50*time.Millisecond,
					"the control: without signatures the forgery settles the order")
				_, reason := status()
				require.Contains(t, reason, "forged")
				return
			}
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, b.sys.Pools["orders"].QueryRow(ctx, `SELECT count(*) FROM inbox_quarantine
					WHERE consumer = 'orders' AND kind = 'invalid' AND message_id = ANY($1) AND reason LIKE 'not authenticated: %'`,
					[]string{unsigned.UUID, otherKey.UUID}).Scan(&n))
				return n == 2
			}, time.Minute, 50*time.Millisecond, "both forgeries quarantined as not authenticated")
			var quarantined int
			require.NoError(t, b.sys.Pools["orders"].QueryRow(ctx, `SELECT count(*) FROM inbox_quarantine
				WHERE consumer = 'orders' AND kind = 'invalid' AND reason LIKE 'not authenticated: %'`).Scan(&quarantined))
			require.Equal(t, 3, quarantined, "the two forgeries and the unsigned record inventory's own principal wrote; nothing the broker refused")
			s, _ := status()
			require.Equal(t, "paid", s, "a forgery settled the order")

			require.NoError(t, inventory.Start())
			require.NoError(t, inventory.WaitReady(ctx))
			require.Eventually(t, func() bool { s, _ := status(); return s == "reserved" }, time.Minute, 50*time.Millisecond,
				"inventory's signed answer settles the order")
		})
	}
}

// forgedAnswer is an InventoryRejected for orderID under a fresh id, as
// inventory would write it, keyed by the order id.
func forgedAnswer(t *testing.T, orderID string) *message.Message {
	t.Helper()
	payload, err := events.Encode(events.InventoryRejected{
		Envelope: events.NewEnvelope(events.TypeInventoryRejected, orderID), Reason: "forged: not inventory's answer",
	})
	require.NoError(t, err)
	return outbox.NewMessage(orderID, payload)
}

// publishAs writes msgs to topic logged in as login, through the listener
// the services use, and returns the broker's answer.
func publishAs(b *testBundle, login kafkaconf.Credentials, topic string, msgs ...*message.Message) error {
	conf := kafkaconf.SaramaAs(login)
	conf.Net.DialTimeout = 3 * time.Second
	conf.Metadata.Retry.Max, conf.Producer.Retry.Max = 1, 0
	return kafkaconf.PublishOnce(b.sys.Kafka.Brokers(), conf, topic, msgs...)
}

// publish writes msgs to topic with a Kafka client of the test's own,
// bypassing every outbox and relay.
func publish(t *testing.T, b *testBundle, topic string, msgs ...*message.Message) {
	t.Helper()
	for _, m := range msgs {
		if m.UUID == "" {
			m.UUID = uuid.NewString()
		}
	}
	require.NoError(t, kafkaconf.PublishOnce(b.sys.Kafka.Brokers(), nil, topic, msgs...))
}
