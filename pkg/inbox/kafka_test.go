package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestSweepKeepsWhatKafkaHolds: with LogStart, a row past Retention stays
// while Kafka still holds a copy of its message, and goes once the log start
// passes the highest offset of the copies the consumer saw. The control, the
// same rows swept by age alone (Sweep before LogStart), deletes them all: a
// group whose offsets expired would then replay a copy Kafka still holds
// and apply it again.
func TestSweepKeepsWhatKafkaHolds(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 4} {
		t.Run(fmt.Sprintf("BatchSize%d", batch), func(t *testing.T) {
			t.Parallel()
			client, err := sarama.NewClient(kfk.Brokers(), kafkatest.Sarama())
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			suffix := watermill.NewShortUUID()
			topic := "inbox-sweep-" + suffix
			require.NoError(t, kfk.CreateTopics(context.Background(), 1, topic))

			cfg := inbox.Config{Retention: time.Hour, RedeliveryHorizon: time.Hour, BatchSize: batch,
				Position: inboxkafka.Position,
				LogStart: func(context.Context) (inbox.LogStart, error) { return inboxkafka.ReadLogStart(client, topic) }}
			in, b := setup(t, cfg)
			byAge := b.newInbox(t, inbox.Config{Retention: time.Hour, RedeliveryHorizon: time.Hour})

			pub := consumeThroughKafka(t, b, in, topic, topic)
			// Offsets 0, 1, 2; 3: a's copy, as a relay that died before
			// marking would publish it; 4: b's id with another payload.
			a, bb, c := outbox.NewMessage("k", []byte("a")), outbox.NewMessage("k", []byte("b")), outbox.NewMessage("k", []byte("c"))
			again := message.NewMessage(a.UUID, a.Payload)
			again.Metadata.Set(outbox.KeyMetadata, "k")
			conflict := message.NewMessage(bb.UUID, []byte("not b"))
			conflict.Metadata.Set(outbox.KeyMetadata, "k")
			require.NoError(t, pub.Publish(topic, a, bb, c, again, conflict))
			eventually(t, func() bool {
				return scalar[int](t, b, `SELECT count(*) FROM inbox_messages`) == 3 &&
					scalar[int](t, b, `SELECT coalesce(sum(duplicates), 0) FROM inbox_messages`) == 1 &&
					scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'payload_conflict'`) == 1
			}, 20*time.Second, "three messages applied, the copy suppressed, the conflict quarantined", b.events.count)
			offsets := map[string]int64{}
			rows, err := b.pool.Query(b.ctx, `SELECT message_id, kafka_partition, kafka_offset FROM inbox_messages`)
			require.NoError(t, err)
			for rows.Next() {
				var id string
				var part int32
				var off int64
				require.NoError(t, rows.Scan(&id, &part, &off))
				require.Zero(t, part)
				offsets[id] = off
			}
			require.NoError(t, rows.Err())
			require.Equal(t, map[string]int64{a.UUID: 3, bb.UUID: 4, c.UUID: 2}, offsets, "each row: the highest offset of its copies")

			_, err = b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - interval '2 hours'`)
			require.NoError(t, err)
			remaining := func() []string {
				rows, err := b.pool.Query(b.ctx, `SELECT message_id FROM inbox_messages`)
				require.NoError(t, err)
				ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(t, err)
				return ids
			}
			deleteRecords := func(before int64) {
				admin, err := sarama.NewClusterAdminFromClient(client)
				require.NoError(t, err)
				require.NoError(t, admin.DeleteRecords(topic, map[int32]int64{0: before}))
			}

			n, err := in.Sweep(b.ctx)
			require.NoError(t, err)
			require.Zero(t, n, "Kafka holds every record: nothing may go")
			deleteRecords(3) // c's record is gone; a's copy and b's conflicting copy are still there
			n, err = in.Sweep(b.ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			require.ElementsMatch(t, []string{a.UUID, bb.UUID}, remaining())
			deleteRecords(4) // a's copy too; b's conflicting copy is still there
			n, err = in.Sweep(b.ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			require.ElementsMatch(t, []string{bb.UUID}, remaining())

			// The control: by age alone, b goes although Kafka holds a copy.
			n, err = byAge.Sweep(b.ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "the control sweeps by age alone")
			require.Empty(t, remaining())
		})
	}
}

// TestCopiesOnTwoTopicsGoByAge: a message whose copies came on two topics
// (a redrive's copy on the consumer's redrive topic, the original on its
// producer's) at the same partition number has no one position a log
// start can pass: its row goes by age alone (partition -1), not by the
// first topic's offset, which the other topic's log start says nothing of.
func TestCopiesOnTwoTopicsGoByAge(t *testing.T) {
	t.Parallel()
	suffix := watermill.NewShortUUID()
	first, second := "inbox-copies-a-"+suffix, "inbox-copies-b-"+suffix
	require.NoError(t, kfk.CreateTopics(context.Background(), 1, first, second))
	in, b := setup(t, inbox.Config{Position: inboxkafka.Position})
	pub := consumeThroughKafka(t, b, in, first, first)
	consumeThroughKafka(t, b, in, second, second)
	m := outbox.NewMessage("k", []byte("m"))
	require.NoError(t, pub.Publish(first, outbox.NewMessage("k", []byte("x")), outbox.NewMessage("k", []byte("y")), m)) // m at offset 2
	eventually(t, func() bool { return scalar[int](t, b, `SELECT count(*) FROM inbox_messages`) == 3 }, 20*time.Second, "three applied", b.events.count)
	copied := message.NewMessage(m.UUID, m.Payload)
	copied.Metadata.Set(outbox.KeyMetadata, "k")
	require.NoError(t, pub.Publish(second, copied)) // its copy at offset 0 of the other topic
	eventually(t, func() bool {
		return scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, m.UUID) == 1
	}, 20*time.Second, "the copy suppressed", b.events.count)
	require.Equal(t, int32(-1), scalar[int32](t, b, `SELECT kafka_partition FROM inbox_messages WHERE message_id = $1`, m.UUID),
		"copies on two topics: swept by age alone")
}

// consumeThroughKafka runs a Watermill router that consumes topic as group
// through in's middleware into b's handler, until the test ends, and returns
// a publisher onto Kafka.
func consumeThroughKafka(t *testing.T, b *testBundle, in *inbox.Inbox, topic, group string) message.Publisher {
	t.Helper()
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	logger := watermill.NopLogger{}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: group,
	}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("apply", topic, sub, func(msg *message.Message) error {
		_, err := b.handler.handle(msg)
		return err
	}).AddMiddleware(in.Middleware)

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
	})
	select {
	case <-router.Running():
	case <-b.ctx.Done():
		t.Fatal("router did not start")
	}

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(),
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func TestRouterWithKafka(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond})
	poisonErr := errors.New("poison pill")
	b.handler.hook = func(msg *message.Message, _ int) error {
		if bytes.Equal(msg.Payload, []byte("poison")) {
			return poisonErr
		}
		return nil
	}

	suffix := watermill.NewShortUUID()
	topic, group := "inbox-test-"+suffix, "inbox-test-"+suffix
	require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic))
	pub := consumeThroughKafka(t, b, in, topic, group)

	// Poison first, then a good message with the same key: same partition,
	// so the good one waits behind the poison until the inbox settles it.
	poison := outbox.NewMessage("order-1", []byte("poison"))
	good := outbox.NewMessage("order-1", []byte("good"))
	// One message published twice, as a relay that died before marking its
	// batch would.
	twice := outbox.NewMessage("order-2", []byte("twice"))
	again := message.NewMessage(twice.UUID, twice.Payload)
	again.Metadata.Set(outbox.KeyMetadata, twice.Metadata.Get(outbox.KeyMetadata))
	start := time.Now()
	require.NoError(t, pub.Publish(topic, poison, good, twice, again))

	status := func(id string) string {
		var s string
		err := b.pool.QueryRow(b.ctx, `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&s)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			require.NoError(t, err)
		}
		return s
	}
	eventually(t, func() bool { return status(good.UUID) == "processed" }, 20*time.Second, "the good message to be applied", b.events.count)
	eventually(t, func() bool {
		return scalar[int](t, b, `SELECT coalesce(sum(duplicates), 0) FROM inbox_messages WHERE message_id = $1`, twice.UUID) == 1
	}, 20*time.Second, "the second copy to be suppressed", b.events.count)
	t.Logf("settled %v after publishing", time.Since(start))

	require.Equal(t, "dead_lettered", status(poison.UUID))
	require.Equal(t, 3, b.handler.callsFor(poison.UUID), "poison runs: MaxAttempts, then acknowledged")
	require.Equal(t, 0, appliedRows(t, b, consumer, poison.UUID))
	require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Retried, inbox.DeadLettered}, b.events.outcomes(poison.UUID))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'dead_letter' AND message_id = $1`, poison.UUID))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, consumer+".dlq"))

	require.Equal(t, 1, appliedRows(t, b, consumer, good.UUID))
	require.Equal(t, 1, appliedRows(t, b, consumer, twice.UUID))
	require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(twice.UUID))
	require.Equal(t, topic, scalar[string](t, b, `SELECT topic FROM inbox_messages WHERE message_id = $1`, good.UUID))

	// In partition order: the poison was settled before the good message ran.
	var settled []string
	for _, e := range b.events.all() {
		if e.Outcome != inbox.Retried && (e.MessageID == poison.UUID || e.MessageID == good.UUID) {
			settled = append(settled, string(e.Outcome))
		}
	}
	require.Equal(t, []string{"dead_lettered", "applied"}, settled)

	// Every delivery was acknowledged, the poison included: the group's
	// committed offsets reach the end of the topic.
	admin, err := sarama.NewClusterAdmin(kfk.Brokers(), kafkatest.Sarama())
	require.NoError(t, err)
	defer admin.Close()
	committed := func() int64 { return committedOffsets(t, admin, group, topic) }
	eventually(t, func() bool { return committed() == 4 }, 10*time.Second, "offsets of all four messages to be committed", committed)
}

// committedOffsets sums the offsets group has committed on topic's partitions.
func committedOffsets(t *testing.T, admin sarama.ClusterAdmin, group, topic string) int64 {
	t.Helper()
	resp, err := admin.ListConsumerGroupOffsets(group, nil) // nil: every partition
	require.NoError(t, err)
	var sum int64
	for _, block := range resp.Blocks[topic] {
		if block.Offset > 0 {
			sum += block.Offset
		}
	}
	return sum
}
