package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
)

// Sweep deletes inbox rows and stale attempt counters older than Retention,
// in batches, and returns how many inbox rows it removed. Quarantined and
// dead-lettered messages are kept in inbox_quarantine until an operator
// deals with them; a parked message's row stays until its key is released.
func (in *Inbox) Sweep(ctx context.Context) (int64, error) {
	// With Config.LogStart, a row read from Kafka goes only once its
	// partition's log start has passed the highest offset of its copies;
	// by age alone: rows without an offset (not read from Kafka, or from
	// before migration 003), with copies on several partitions (-1), or of
	// a topic LogStart does not report (one no longer consumed).
	var topics []string
	var parts []int32
	var starts []int64
	if in.cfg.LogStart != nil {
		ls, err := in.cfg.LogStart(ctx)
		if err != nil {
			return 0, fmt.Errorf("inbox: sweep: reading Kafka's log-start offsets: %w", err)
		}
		for topic, ps := range ls {
			for p, start := range ps {
				topics, parts, starts = append(topics, topic), append(parts, p), append(starts, start)
			}
		}
	}
	var total int64
	for {
		tag, err := in.cfg.Pool.Exec(ctx, `
			DELETE FROM inbox_messages
			WHERE (consumer, message_id) IN (
				SELECT m.consumer, m.message_id FROM inbox_messages m
				WHERE m.consumer = $1 AND m.processed_at < now() - $2::interval
				AND m.status <> 'parked' -- not applied yet: it waits for its key's release (hold.go)
				AND (NOT $4 OR m.kafka_offset IS NULL OR m.kafka_partition = -1 OR NOT m.topic = ANY($5) OR EXISTS (
					SELECT 1 FROM unnest($5::text[], $6::int[], $7::bigint[]) AS k(topic, part, start)
					WHERE k.topic = m.topic AND k.part = m.kafka_partition AND m.kafka_offset < k.start))
				ORDER BY m.processed_at
				LIMIT $3)`, pgx.QueryExecModeExec, in.cfg.Consumer, in.cfg.Retention, in.cfg.RetentionBatch, // planned for the table as it is now (see outbox's planEachTime)
			in.cfg.LogStart != nil, topics, parts, starts)
		if err != nil {
			return total, fmt.Errorf("inbox: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(in.cfg.RetentionBatch) {
			break
		}
	}
	if _, err := in.cfg.Pool.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND updated_at < now() - $2::interval`,
		in.cfg.Consumer, in.cfg.Retention); err != nil {
		return total, fmt.Errorf("inbox: sweeping attempts: %w", err)
	}
	return total, nil
}

// sweepEvery calls Sweep every interval until ctx ends.
func (in *Inbox) sweepEvery(ctx context.Context, interval time.Duration) {
	ctxtime.Every(ctx, interval, func() {
		if n, err := in.Sweep(ctx); err != nil && ctx.Err() == nil {
			in.cfg.log.Error("Inbox retention sweep failed", err, watermill.LogFields{"consumer": in.cfg.Consumer})
		} else if n > 0 {
			in.cfg.log.Info("Inbox retention sweep", watermill.LogFields{"consumer": in.cfg.Consumer, "deleted": n})
		}
	})
}
