package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
)

// Retention: published rows are deleted Retention after they were
// published, in batches; in a partitioned outbox (RelayConfig.Partitions),
// whole partitions are dropped instead (partition.go).

// retain runs the retention round every RetentionInterval, and a
// partitioned outbox's once at the start, so that its partitions ahead are
// made before the relay's first interval ends.
func (r *Relay) retain(ctx context.Context) {
	round := func() {
		if r.cfg.Partitions == nil {
			if _, err := r.DeletePublished(ctx); err != nil && ctx.Err() == nil {
				r.cfg.log.Error("Outbox retention failed", err, nil)
			}
			return
		}
		dropped, err := r.RetirePartitions(ctx)
		if err != nil && ctx.Err() == nil {
			r.cfg.log.Error("Outbox partition retention failed", err, nil)
		}
		for _, name := range dropped {
			r.cfg.log.Info("Outbox partition dropped: every row in it published and past retention",
				watermill.LogFields{"partition": name})
		}
	}
	if r.cfg.Partitions != nil {
		round()
	}
	ctxtime.Every(ctx, r.cfg.RetentionInterval, round)
}

// DeletePublished removes rows published more than Retention ago, at most
// RetentionBatch per statement, and returns how many it removed.
func (r *Relay) DeletePublished(ctx context.Context) (int64, error) {
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
		r.stats.deleted.Add(tag.RowsAffected())
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			return total, nil
		}
	}
}
