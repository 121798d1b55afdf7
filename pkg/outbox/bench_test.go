package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// BenchmarkPublishTx measures a producer transaction that writes one outbox
// row and commits (with fsync on, as in production).
func BenchmarkPublishTx(b *testing.B) {
	ctx := context.Background()
	pool := newPool(b)
	topic := uniqueName(b)
	for b.Loop() {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("key", []byte(`{"n":1}`)))
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelay measures the relay draining committed rows to Kafka with
// RelayOnce: claim, publish (one acknowledged produce per message), mark.
func BenchmarkRelay(b *testing.B) {
	for _, batchSize := range []int{100, 500} {
		b.Run(fmt.Sprint("BatchSize=", batchSize), func(b *testing.B) {
			const rows = 1000
			ctx := context.Background()
			pool := newPool(b)
			topic := newTopic(b)
			relay := newRelay(b, outbox.RelayConfig{Pool: pool, Publisher: newPublisher(b), BatchSize: batchSize})
			var iterations int
			for b.Loop() {
				b.StopTimer()
				msgs := make([]*message.Message, rows)
				for i := range msgs {
					msgs[i] = outbox.NewMessage(fmt.Sprint("key-", i%16), []byte(`{"n":1}`))
				}
				publishCommitted(b, pool, topic, msgs...)
				b.StartTimer()

				for left := rows; left > 0; {
					n, err := relay.RelayOnce(ctx)
					if err != nil {
						b.Fatal(err)
					}
					left -= n
				}
				iterations++
			}
			b.ReportMetric(float64(rows*iterations)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
