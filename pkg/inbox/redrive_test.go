package inbox_test

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// TestRedriveTopic: a consumer that may not write its producer's topic
// redrives through a topic of its own (Config.RedriveTopic). A poison
// message dead-letters and holds its key, a second message of the key parks
// behind it; the redrive writes the copy to the redrive topic, signed by
// the consumer's own relay, naming the topic it came from; read from there,
// it is applied once, releases its key (held under the producer's topic),
// and the parked message follows; its inbox row holds the redrive topic's
// position. Nothing is written to the producer's topic. A copy on the
// redrive topic that does not say where it came from, or names the redrive
// topic itself, is quarantined unread.
func TestRedriveTopic(t *testing.T) {
	t.Parallel()
	suffix := watermill.NewShortUUID()
	topic, redrive := "produced-"+suffix, consumer+".redrive-"+suffix
	producer := signature.Key{ID: "producer", Secret: bytes.Repeat([]byte{1}, 32)}
	own := signature.Key{ID: "consumer", Secret: bytes.Repeat([]byte{2}, 32)}
	verifier, err := signature.NewVerifier(
		signature.Trusted{Key: producer, Topics: []string{topic}},
		signature.Trusted{Key: own, Topics: []string{redrive}}) // its redrives: signed by its own relay
	require.NoError(t, err)
	in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond, OnDeadLetter: inbox.HoldKey,
		RedriveTopic: redrive, Verify: inboxkafka.Verify(verifier), Key: inboxkafka.Key, Position: inboxkafka.Position})
	require.Equal(t, redrive, in.RedriveTopic())
	runInbox(t, in) // records the redrive topic
	var fixed atomic.Bool
	b.handler.hook = func(msg *message.Message, _ int) error {
		if bytes.Equal(msg.Payload, []byte("needs v2")) && !fixed.Load() {
			return errors.New("unknown field in payload")
		}
		return nil
	}

	require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic, redrive))
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	logger := watermill.NopLogger{}
	subscriber := func(group string) *kafka.Subscriber {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: group,
		}, logger)
		require.NoError(t, err)
		return sub
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(),
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	handle := func(msg *message.Message) error {
		_, err := b.handler.handle(msg)
		return err
	}
	router.AddConsumerHandler("apply", topic, subscriber("group-"+suffix), handle).AddMiddleware(in.Middleware)
	router.AddConsumerHandler("apply-redrives", redrive, subscriber("group-"+suffix+".redrive"), handle).AddMiddleware(in.Middleware)
	// The consumer's own relay, signing with its own key: it publishes the
	// redrive's copy (and the dead letter).
	signed, err := signature.NewPublisher(pub, own, outbox.PartitionKey)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Publisher: signed, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	runRouterAndRelay(t, b.ctx, router, relay)

	produce := func(to string, k signature.Key, payload string, md map[string]string) *message.Message {
		msg := outbox.NewMessage("order-1", []byte(payload))
		for name, v := range md {
			msg.Metadata.Set(name, v)
		}
		signature.Sign(k, to, "order-1", msg)
		require.NoError(t, pub.Publish(to, msg))
		return msg
	}
	status := func(id string) string {
		return scalar[string](t, b, `SELECT coalesce((SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2), '')`, consumer, id)
	}
	poison := produce(topic, producer, "needs v2", nil)
	eventually(t, func() bool { return status(poison.UUID) == "dead_lettered" }, 20*time.Second, "the poison message to be dead-lettered", b.events.count)
	next := produce(topic, producer, "next", nil)
	eventually(t, func() bool { return status(next.UUID) == "parked" }, 20*time.Second, "the next message of its key to park", b.events.count)

	fixed.Store(true)
	dl := quarantineID(t, b, inbox.KindDeadLetter, poison.UUID)
	res, err := inboxadmin.New(b.pool).Retry(b.ctx, dl, "alice")
	require.NoError(t, err)
	require.True(t, res.Redriven, res.Note)
	require.Contains(t, res.Note, "written back to "+redrive)
	eventually(t, func() bool { return status(next.UUID) == "processed" }, 20*time.Second, "the parked message to follow the redriven one", b.events.count)
	require.Equal(t, "processed", status(poison.UUID))
	require.Equal(t, 1, appliedRows(t, b, consumer, poison.UUID))
	require.Equal(t, 3, b.handler.callsFor(poison.UUID), "two failed runs, then the redriven copy")
	require.Equal(t, 1, b.handler.callsFor(next.UUID))
	require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, topic), "nothing written to the producer's topic")
	require.Equal(t, topic, scalar[string](t, b, `SELECT metadata->>$2 FROM outbox_messages WHERE topic = $1`, redrive, inbox.RedriveTopicMetadata))
	require.Equal(t, redrive, scalar[string](t, b, `SELECT topic FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND kafka_offset IS NOT NULL`,
		consumer, poison.UUID), "the row holds where Kafka holds the copy it applied")
	// The hold goes once the release finds nothing more parked: a
	// transaction after the last parked message's.
	eventually(t, func() bool {
		return scalar[int](t, b, `SELECT count(*) FROM inbox_held_keys WHERE consumer = $1`, consumer) == 0
	}, 20*time.Second, "the key to be released", b.events.count)

	// Copies on the redrive topic that do not say where they came from:
	// signed with the consumer's key, so only the header is wrong.
	for _, tc := range []struct {
		name, origin, reason string
	}{
		{"no origin", "", "without the topic it came from"},
		{"itself as origin", redrive, "names \"" + redrive + "\" as the topic it came from"},
	} {
		md := map[string]string{}
		if tc.origin != "" {
			md[inbox.RedriveTopicMetadata] = tc.origin
		}
		msg := produce(redrive, own, "good", md)
		eventually(t, func() bool {
			return scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE consumer = $1 AND message_id = $2`, consumer, msg.UUID) == 1
		}, 20*time.Second, tc.name+": the copy to be quarantined", b.events.count)
		q, err := inboxadmin.New(b.pool).GetQuarantined(b.ctx, quarantineID(t, b, inbox.KindInvalid, msg.UUID))
		require.NoError(t, err, tc.name)
		require.Contains(t, q.Reason, tc.reason, tc.name)
		require.Zero(t, b.handler.callsFor(msg.UUID), tc.name)
	}
}
