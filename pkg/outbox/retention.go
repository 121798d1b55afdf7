package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgtype"

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
	// Each batch starts at the newest published_at the last one deleted
	// ($3), not at the oldest row: the deleted rows stay in the index until
	// vacuum, and while an older snapshot is open anywhere in the database
	// a scan from the start would visit each of them in the heap again
	// (as the inbox's Sweep; BenchmarkDeletePublishedBacklog).
	var total int64
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		var n int64
		var last pgtype.Timestamptz
		err := r.cfg.Pool.QueryRow(ctx, `
			WITH gone AS (
				DELETE FROM outbox_messages
				WHERE id IN (
					SELECT id FROM outbox_messages
					WHERE published_at < now() - $1::interval AND published_at >= $3
					ORDER BY published_at
					LIMIT $2)
				RETURNING published_at)
			SELECT count(*), max(published_at) FROM gone`, planEachTime, r.cfg.Retention, r.cfg.RetentionBatch, from).Scan(&n, &last)
		if err != nil {
			return total, fmt.Errorf("outbox retention: %w", err)
		}
		total += n
		r.stats.deleted.Add(n)
		if n < int64(r.cfg.RetentionBatch) {
			return total, nil
		}
		from = last
	}
}
