package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// BenchmarkPublishTx measures a producer transaction that writes outbox
// rows and commits (with fsync on, as in production): one row, or 100 rows
// of 100 keys (a batch of payments), with the per-key lock that keeps
// commit order (see PublishTx) and without it (Writer.Unordered), side by
// side: the lock's cost is the ratio.
func BenchmarkPublishTx(b *testing.B) {
	for _, rows := range []int{1, 100} {
		for _, w := range []struct {
			name   string
			writer outbox.Writer
		}{{"KeyLock", outbox.Writer{}}, {"Unordered", outbox.Writer{Unordered: true}}} {
			b.Run(fmt.Sprintf("Rows=%d/%s", rows, w.name), func(b *testing.B) {
				ctx := context.Background()
				pool := newPool(b)
				topic := uniqueName(b)
				var n int
				for b.Loop() {
					msgs := make([]*message.Message, rows)
					for i := range msgs {
						n++
						msgs[i] = outbox.NewMessage(fmt.Sprint("key-", n), []byte(`{"n":1}`))
					}
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						return w.writer.PublishTx(ctx, tx, topic, msgs...)
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
			})
		}
	}
}

// BenchmarkRelay measures the relay draining committed rows to Kafka with
// RelayOnce: claim, publish (one acknowledged produce per message), mark;
// on a plain table and on a partitioned one (RelayConfig.Partitions), side
// by side, each with the same 20,000 published rows of history (in the
// partitioned table's first partition).
func BenchmarkRelay(b *testing.B) {
	for _, batchSize := range []int{100, 500} {
		for _, partitioned := range []bool{false, true} {
			name := fmt.Sprint("BatchSize=", batchSize)
			if partitioned {
				name += "/Partitioned"
			}
			b.Run(name, func(b *testing.B) { benchmarkRelay(b, batchSize, partitioned) })
		}
	}
}

func benchmarkRelay(b *testing.B, batchSize int, partitioned bool) {
	const rows = 1000
	ctx := context.Background()
	pool := newPool(b)
	topic := newTopic(b)
	insertPublished(b, pool, topic, 20000, 0)
	cfg := outbox.RelayConfig{Pool: pool, Publisher: newPublisher(b), BatchSize: batchSize}
	if partitioned {
		cfg.Partitions = &outbox.Partitioning{}
		if err := outbox.PartitionByTime(ctx, pool, *cfg.Partitions); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE outbox_messages`); err != nil {
		b.Fatal(err)
	}
	relay := newRelay(b, cfg)
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
}

// BenchmarkDeletePublishedBacklog: one DeletePublished through a backlog
// of published rows past retention (the retention lowered, or the relay's
// retention off for a while), beside the deletion whose every batch scanned
// from the oldest row, in one run; with and without a snapshot held open
// elsewhere in the database, which keeps each deleted row's index entry
// pointing at a version a scan must look at. Reported: rows deleted per
// second.
//
//	go test ./outbox -run '^$' -bench BenchmarkDeletePublishedBacklog -benchtime 1x
func BenchmarkDeletePublishedBacklog(b *testing.B) {
	const rows, batch = 1_000_000, 5000
	for _, held := range []bool{false, true} {
		for _, v := range []struct {
			name   string
			delete func(*outbox.Relay, context.Context) (int64, error)
		}{
			{"FromOldest", (*outbox.Relay).DeletePublishedFromOldest},
			{"DeletePublished", (*outbox.Relay).DeletePublished},
		} {
			name := v.name
			if held {
				name += "/SnapshotHeld"
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				pool := newPool(b)
				relay := newRelay(b, outbox.RelayConfig{Pool: pool, Publisher: countingPublisher{},
					Retention: 24 * time.Hour, RetentionBatch: batch})
				var deleted int64
				var took time.Duration
				for range b.N {
					_, err := pool.Exec(ctx, `
						INSERT INTO outbox_messages (message_id, topic, payload, published_at)
						SELECT gen_random_uuid(), 't', '\x00', now() - interval '8 days' + n * interval '1 ms'
						FROM generate_series(1, $1::int) AS n`, rows)
					require.NoError(b, err)
					_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox_messages`)
					require.NoError(b, err)
					var snapshot pgx.Tx
					if held {
						snapshot, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
						require.NoError(b, err)
						_, err = snapshot.Exec(ctx, `SELECT count(*) FROM outbox_shards`)
						require.NoError(b, err)
					}
					start := time.Now()
					n, err := v.delete(relay, ctx)
					took += time.Since(start)
					require.NoError(b, err)
					require.Equal(b, int64(rows), n)
					deleted += n
					if snapshot != nil {
						require.NoError(b, snapshot.Rollback(ctx))
					}
				}
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(float64(deleted)/took.Seconds(), "rows/s")
			})
		}
	}
}
