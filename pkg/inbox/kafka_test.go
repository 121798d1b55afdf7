package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
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
			}, 20*time.Second, "three messages applied, the copy suppressed, the conflict quarantined")
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
