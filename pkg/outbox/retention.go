package outbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
	"github.com/outboxref/outbox-inbox/pkg/internal/pgtable"
)

// Retention: published rows are deleted Retention after they were
// published, in batches; in a partitioned outbox (RelayConfig.Partitions),
// whole partitions are dropped instead (partition.go).

// retain runs the retention round every RetentionInterval, and a
// partitioned outbox's once at the start, so that its partitions ahead are
// made before the relay's first interval ends.
func (r *Relay) retain(ctx context.Context) {
	round := func() {
		if _, err := r.DeleteKeySequences(ctx); err != nil && ctx.Err() == nil {
			r.cfg.log.Error("Outbox retention of key counters failed", err, nil)
		}
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

// DeleteKeySequences removes the counters (SequenceMetadata) of keys no
// message was written for in KeySequenceRetention and none of whose rows
// waits to be sent (a parked row keeps its key's counter), at most
// RetentionBatch per statement, and returns how many it removed.
func (r *Relay) DeleteKeySequences(ctx context.Context) (int64, error) {
	total, err := pgtable.DeleteByTime(ctx, r.cfg.Pool, `
		WITH gone AS (
			DELETE FROM outbox_key_sequences k
			WHERE (topic, partition_key) IN (
				SELECT c.topic, c.partition_key FROM outbox_key_sequences c
				WHERE c.touched_at < now() - $1::interval AND c.touched_at >= $3
				-- not while a numbered row of the key waits to be sent; in
				-- the batch's choice, so that kept keys never fill a batch
				-- (one that deletes fewer than its size ends the round)
				AND NOT EXISTS (SELECT 1 FROM outbox_messages m
					WHERE m.topic = c.topic AND m.partition_key = c.partition_key AND m.published_at IS NULL)
				ORDER BY c.touched_at
				LIMIT $2)
			-- again, on the row as it is once locked: a PublishTx that
			-- numbered the key meanwhile keeps it
			AND k.touched_at < now() - $1::interval
			RETURNING touched_at)
		SELECT count(*), max(touched_at) FROM gone`, r.cfg.RetentionBatch, r.cfg.KeySequenceRetention, r.cfg.RetentionBatch)
	if err != nil {
		return total, fmt.Errorf("outbox retention of key counters: %w", err)
	}
	return total, nil
}

// DeletePublished removes rows published more than Retention ago, at most
// RetentionBatch per statement, and returns how many it removed.
func (r *Relay) DeletePublished(ctx context.Context) (int64, error) {
	// Batch after batch, each from the newest published_at the last one
	// deleted ($3), not from the oldest row (pgtable.DeleteByTime says why).
	total, err := pgtable.DeleteByTime(ctx, r.cfg.Pool, `
		WITH gone AS (
			DELETE FROM outbox_messages
			WHERE id IN (
				SELECT id FROM outbox_messages
				WHERE published_at < now() - $1::interval AND published_at >= $3
				ORDER BY published_at
				LIMIT $2)
			RETURNING published_at)
		SELECT count(*), max(published_at) FROM gone`, r.cfg.RetentionBatch, r.cfg.Retention, r.cfg.RetentionBatch)
	r.stats.deleted.Add(total)
	if err != nil {
		return total, fmt.Errorf("outbox retention: %w", err)
	}
	return total, nil
}
