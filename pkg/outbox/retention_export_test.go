package outbox

import (
	"context"
	"fmt"
)

// DeletePublishedFromOldest is DeletePublished as it was before each batch
// started where the last one ended: every batch scans from the oldest
// published row. Only BenchmarkDeletePublishedBacklog runs it, beside
// DeletePublished.
func (r *Relay) DeletePublishedFromOldest(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.cfg.Pool.Exec(ctx, `
			DELETE FROM outbox_messages
			WHERE id IN (
				SELECT id FROM outbox_messages
				WHERE published_at < now() - $1::interval
				ORDER BY published_at
				LIMIT $2)`, planEachTime, r.cfg.Retention, r.cfg.RetentionBatch)
		if err != nil {
			return total, fmt.Errorf("outbox retention: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			return total, nil
		}
	}
}
