package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// insertRow writes msg as an outbox row with plain SQL, as a row written
// before PublishTx checked sizes, or by another program, would be: the relay
// must cope with whatever the table holds.
func insertRow(t testing.TB, pool *pgxpool.Pool, topic string, msg *message.Message) {
	t.Helper()
	meta, err := json.Marshal(msg.Metadata)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `
		INSERT INTO outbox_messages (message_id, topic, partition_key, payload, metadata)
		VALUES ($1, $2, $3, $4, $5)`, msg.UUID, topic, msg.Metadata.Get(outbox.KeyMetadata), []byte(msg.Payload), meta)
	require.NoError(t, err)
}

// parkReason returns the reason the row of msg was parked with, "" when it
// is not parked.
func parkReason(t testing.TB, pool *pgxpool.Pool, msg *message.Message) string {
	t.Helper()
	var reason *string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT park_reason FROM outbox_messages WHERE message_id = $1`, msg.UUID).Scan(&reason))
	if reason == nil {
		return ""
	}
	return *reason
}

// TestRelayParksWhatTheBrokerCannotTake: one row that can never be published
// must not stop the outbox. Before parking, a batch with such a row failed
// whole and the next claim took the same lowest ids, so the row was in every
// batch: the good rows before it were sent again and again, those after it
// never.
func TestRelayParksWhatTheBrokerCannotTake(t *testing.T) {
	t.Parallel()

	// Over the producer's limit (Sarama's Producer.MaxMessageBytes, 1,000,000
	// by default): Sarama refuses it before it reaches the broker.
	t.Run("OverTheProducerLimit", func(t *testing.T) {
		t.Parallel()
		pool, topic := newPool(t), newTopic(t)
		sink := newSink(t, topic)
		before := []*message.Message{newKeyedMessage("a", 1), newKeyedMessage("b", 1)}
		huge := outbox.NewMessage("c", bytes.Repeat([]byte("x"), 1<<20))
		after := []*message.Message{newKeyedMessage("d", 1), newKeyedMessage("a", 2)}
		for _, m := range before {
			insertRow(t, pool, topic, m)
		}
		insertRow(t, pool, topic, huge)
		for _, m := range after {
			insertRow(t, pool, topic, m)
		}

		relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: newPublisher(t), ErrorBackoff: 10 * time.Millisecond})
		startRelay(t, relay)
		good := ids(append(before, after...))
		sink.WaitFor(t, good)
		eventually(t, waitTimeout, func() bool { return parkReason(t, pool, huge) != "" }, "the oversize row was not parked")
		time.Sleep(300 * time.Millisecond) // room for a wrongly repeated send to show
		counts := sink.Counts()
		for _, id := range good {
			require.Equal(t, 1, counts[id], "message %s reached Kafka %d times", id, counts[id])
		}
		require.Zero(t, counts[huge.UUID])
		require.Contains(t, parkReason(t, pool, huge), "over the relay's 1000000-byte MaxMessageBytes")
		require.Equal(t, int64(1), relay.Stats().Parked)
	})

	// Under the producer's limit but over the topic's max.message.bytes: the
	// broker refuses the batch, and the relay finds the row one send at a
	// time. The row's key waits behind it; other keys go on; Drop and Retry
	// let the key go on.
	//
	// Through watermill-kafka's Publisher the relay needs outboxkafka's
	// IsPermanent to tell Sarama's refusals; outboxkafka's Publisher wraps
	// them in outbox.Permanent, so the relay's default sees them.
	for _, via := range []struct {
		name        string
		publisher   func(testing.TB) message.Publisher
		isPermanent func(error) bool
	}{
		{"WatermillKafka", func(t testing.TB) message.Publisher { return newPublisher(t) }, outboxkafka.IsPermanent},
		{"OutboxKafka", func(t testing.TB) message.Publisher { return newBatchPublisher(t) }, nil},
	} {
		t.Run("RefusedByTheBroker/"+via.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := newPool(t)
			topic := uniqueName(t)
			require.NoError(t, testKafka.CreateTopicsWithConfig(ctx, partitions, map[string]string{"max.message.bytes": "4096"}, topic))
			sink := newSink(t, topic)

			big := func(key string) *message.Message { return outbox.NewMessage(key, bytes.Repeat([]byte("y"), 8<<10)) }
			a1, a2 := newKeyedMessage("a", 1), newKeyedMessage("a", 2)
			b1, b2, b3 := newKeyedMessage("b", 1), big("b"), newKeyedMessage("b", 3)
			c1, c2, c3 := newKeyedMessage("c", 1), big("c"), newKeyedMessage("c", 3)
			publishCommitted(t, pool, topic, a1, b1, b2, c1, c2, a2, b3, c3)

			relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: via.publisher(t), IsPermanent: via.isPermanent, ErrorBackoff: 10 * time.Millisecond})
			startRelay(t, relay)
			sink.WaitFor(t, ids([]*message.Message{a1, a2, b1, c1}))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Parked == 2 })
			require.Contains(t, parkReason(t, pool, b2), "the broker refused it")
			require.Contains(t, parkReason(t, pool, b2), "too large")

			parked, err := outboxadmin.New(pool).ListParked(ctx, outboxadmin.ParkedFilter{})
			require.NoError(t, err)
			require.Len(t, parked, 2)
			require.Equal(t, b2.UUID, parked[0].MessageID)
			require.Equal(t, "b", parked[0].Key)
			require.Equal(t, 1, parked[0].Waiting, "b3 waits behind b2")
			require.Equal(t, c2.UUID, parked[1].MessageID)

			time.Sleep(300 * time.Millisecond) // room for a waiting row to leak out
			counts := sink.Counts()
			require.Zero(t, counts[b3.UUID], "b3 overtook the parked b2")
			require.Zero(t, counts[c3.UUID], "c3 overtook the parked c2")

			// Dropping b2 lets b3 go; retrying c2 without a fix parks it
			// again, and c3 still waits.
			require.ErrorContains(t, outboxadmin.New(pool).Drop(ctx, parked[0].ID, "", "why"), "who drops")
			require.NoError(t, outboxadmin.New(pool).Drop(ctx, parked[0].ID, "test", "too large for the topic"))
			require.ErrorIs(t, outboxadmin.New(pool).Drop(ctx, parked[0].ID, "test", "again"), outboxadmin.ErrNotParked)
			sink.WaitFor(t, []string{b3.UUID})
			require.NoError(t, outboxadmin.New(pool).Retry(ctx, parked[1].ID))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Parked == 3 })
			require.Zero(t, sink.Counts()[c3.UUID], "c3 overtook the parked c2")

			var by, why string
			require.NoError(t, pool.QueryRow(ctx, `SELECT dropped_by, drop_reason FROM outbox_dropped WHERE message_id = $1`, b2.UUID).Scan(&by, &why))
			require.Equal(t, []string{"test", "too large for the topic"}, []string{by, why})
			require.Equal(t, 1, countRows(t, pool, "published_at IS NULL AND parked_at IS NULL"), "only c3 waits")
		})
	}
}

func TestPublishTxRefusesWhatNoBrokerTakes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, topic := newPool(t), newTopic(t)

	under := outbox.NewMessage("k", bytes.Repeat([]byte("x"), 900_000))
	over := outbox.NewMessage("k", bytes.Repeat([]byte("x"), 1_000_000))
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		require.NoError(t, outbox.PublishTx(ctx, tx, topic, under))
		err := outbox.PublishTx(ctx, tx, topic, over)
		require.ErrorIs(t, err, outbox.ErrMessageTooLarge)
		require.ErrorContains(t, err, "over the 1000000-byte limit")
		small := outbox.Writer{MaxMessageBytes: 1000}
		require.NoError(t, small.PublishTx(ctx, tx, topic, outbox.NewMessage("k", bytes.Repeat([]byte("x"), 500))))
		require.ErrorIs(t, small.PublishTx(ctx, tx, topic, outbox.NewMessage("k", bytes.Repeat([]byte("x"), 1000))), outbox.ErrMessageTooLarge)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2, countRows(t, pool, "true"))
}

// TestRecordBytesMatchesSarama: the size PublishTx and the relay check is
// the one Sarama checks against Producer.MaxMessageBytes, for the record
// watermill-kafka's partitioning marshaler makes.
func TestRecordBytesMatchesSarama(t *testing.T) {
	t.Parallel()
	msg := outbox.NewMessage("order-1", []byte(`{"n":1}`))
	msg.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	km, err := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey).Marshal("t", msg)
	require.NoError(t, err)
	require.Equal(t, km.ByteSize(2), outbox.RecordBytes(msg))
}

// TestRelayBacksOffOnTransientFailures: while the broker is down, the wait
// between batches grows instead of the whole batch being sent again every
// ErrorBackoff.
func TestRelayBacksOffOnTransientFailures(t *testing.T) {
	t.Parallel()
	pool, topic := newPool(t), newTopic(t)
	pub := &faultyPublisher{Publisher: newPublisher(t)}
	pub.down.Store(true)
	publishCommitted(t, pool, topic, outbox.NewMessage("k", nil))
	relay := newRelay(t, outbox.RelayConfig{Pool: pool, Publisher: pub,
		ErrorBackoff: 10 * time.Millisecond, MaxErrorBackoff: 160 * time.Millisecond})
	run := startRelay(t, relay)
	time.Sleep(time.Second)
	run.Stop(t)
	// A fixed 10ms would fail ~90 times in a second; 10, 20, 40, 80, 160,
	// 160, ... fails ~9 times.
	failed := relay.Stats().Errors
	require.Less(t, failed, int64(20), "no backoff: %d failed batches in one second", failed)
	require.Greater(t, failed, int64(4), "the backoff grew past its cap: %d failed batches", failed)
	require.Zero(t, relay.Stats().Parked, "a transient failure parked a row")
}
