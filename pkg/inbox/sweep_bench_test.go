package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// BenchmarkSweepBacklog: one Sweep through a backlog of expired rows (the
// retention lowered, or switched on for the first time), beside the sweep
// whose every batch scanned from the oldest row, in one run. With a
// snapshot held open elsewhere in the database (a long report, a stuck
// transaction), the rows each batch deleted cannot be skipped in the index
// without a look at the heap, so a scan from the oldest row looks at every
// row deleted before it again. Reported: rows deleted per second.
//
//	go test ./inbox -run '^$' -bench BenchmarkSweepBacklog -benchtime 1x
func BenchmarkSweepBacklog(b *testing.B) {
	const rows, batch = 1_000_000, 5000
	for _, held := range []bool{false, true} {
		for _, v := range []struct {
			name  string
			sweep func(*inbox.Inbox, context.Context) (int64, error)
		}{
			{"FromOldest", (*inbox.Inbox).SweepFromOldest},
			{"Sweep", (*inbox.Inbox).Sweep},
		} {
			name := v.name
			if held {
				name += "/SnapshotHeld"
			}
			b.Run(name, func(b *testing.B) {
				ctx := context.Background()
				pool := newTestDB(b, ctx)
				in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer, Retention: 7 * 24 * time.Hour, RetentionBatch: batch})
				require.NoError(b, err)
				var deleted int64
				var took time.Duration
				for range b.N {
					_, err := pool.Exec(ctx, `
						INSERT INTO inbox_messages (consumer, message_id, payload_sha256, processed_at)
						SELECT $1, 'm' || n, '\x00', now() - interval '8 days' + n * interval '1 ms'
						FROM generate_series(1, $2::int) AS n`, consumer, rows)
					require.NoError(b, err)
					_, err = pool.Exec(ctx, `VACUUM ANALYZE inbox_messages`)
					require.NoError(b, err)
					var snapshot pgx.Tx
					if held {
						snapshot, err = pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
						require.NoError(b, err)
						_, err = snapshot.Exec(ctx, `SELECT count(*) FROM inbox_attempts`)
						require.NoError(b, err)
					}
					start := time.Now()
					n, err := v.sweep(in, ctx)
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
