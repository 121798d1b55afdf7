package inbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SweepFromOldest is the sweep as it was before each batch started where
// the last one ended: every batch scans from the oldest row. Only
// BenchmarkSweepBacklog runs it, beside Sweep. (Plain tables, no Kafka log
// starts.)
func (in *Inbox) SweepFromOldest(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := in.cfg.Pool.Exec(ctx, `
			DELETE FROM inbox_messages
			WHERE (consumer, message_id) IN (
				SELECT m.consumer, m.message_id FROM inbox_messages m
				WHERE m.consumer = $1 AND `+sweepable+`
				ORDER BY m.processed_at
				LIMIT $7)`, pgx.QueryExecModeExec,
			in.cfg.Consumer, in.cfg.Retention, false, []string{}, []int32{}, []int64{}, in.cfg.RetentionBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(in.cfg.RetentionBatch) {
			return total, nil
		}
	}
}
