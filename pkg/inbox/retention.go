package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
	"github.com/outboxref/outbox-inbox/pkg/internal/pgtable"
)

// Sweep deletes inbox rows, stale attempt counters and the continuity
// state of keys not heard from (continuity.go) older than Retention,
// in batches, and returns how many inbox rows it removed. Quarantined and
// dead-lettered messages are kept in inbox_quarantine until an operator
// deals with them; a parked message's row stays until its key is released.
// With Config.Partitions it makes the partitions ahead and drops, instead of
// deleting their rows, the partitions whose rows may all go (partition.go);
// it deletes rows only from the default partition, and counts only those.
func (in *Inbox) Sweep(ctx context.Context) (int64, error) {
	if in.cfg.Partitions != nil {
		// First, and whatever fails after: deliveries need the partitions
		// ahead more than retention needs anything.
		if _, err := makePartitions(ctx, in.cfg.Pool, *in.cfg.Partitions, time.Now()); err != nil {
			return 0, fmt.Errorf("inbox: sweep: %w", err)
		}
	}
	ls, err := in.logStarts(ctx)
	if err != nil {
		return 0, err
	}
	table := "inbox_messages"
	if in.cfg.Partitions != nil {
		// Whole partitions go by DROP; rows go by DELETE only from the
		// default partition (late ids: a redriven dead letter).
		dropped, err := in.sweepPartitions(ctx, ls) // partition.go
		if len(dropped) > 0 {
			in.cfg.log.Info("Inbox retention dropped partitions", watermill.LogFields{"consumer": in.cfg.Consumer, "partitions": dropped})
		}
		if err != nil {
			return 0, fmt.Errorf("inbox: sweep: %w", err)
		}
		table = partitionDefault
	}
	// Batch after batch, each from where the last one ended ($8, the
	// newest processed_at it deleted), not from the oldest row
	// (pgtable.DeleteByTime says why). A row left behind (not sweepable
	// yet) is looked at again by the next Sweep.
	total, err := pgtable.DeleteByTime(ctx, in.cfg.Pool, `
		WITH gone AS (
			DELETE FROM `+table+`
			WHERE (consumer, message_id) IN (
				SELECT m.consumer, m.message_id FROM `+table+` m
				WHERE m.consumer = $1 AND m.processed_at >= $8 AND `+sweepable+`
				ORDER BY m.processed_at
				LIMIT $7)
			RETURNING processed_at)
		SELECT count(*), max(processed_at) FROM gone`, in.cfg.RetentionBatch,
		in.cfg.Consumer, in.cfg.Retention, ls.on, ls.topics, ls.parts, ls.starts, in.cfg.RetentionBatch)
	if err != nil {
		return total, fmt.Errorf("inbox: sweep: %w", err)
	}
	if _, err := in.cfg.Pool.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND updated_at < now() - $2::interval`,
		in.cfg.Consumer, in.cfg.Retention); err != nil {
		return total, fmt.Errorf("inbox: sweeping attempts: %w", err)
	}
	// A key not heard from within Retention starts afresh (continuity.go).
	if _, err := pgtable.DeleteByTime(ctx, in.cfg.Pool, `
		WITH gone AS (
			DELETE FROM inbox_key_sequences
			WHERE (consumer, topic, partition_key, stream) IN (
				SELECT consumer, topic, partition_key, stream FROM inbox_key_sequences
				WHERE consumer = $1 AND touched_at < now() - $2::interval AND touched_at >= $4
				ORDER BY touched_at
				LIMIT $3)
			-- again, on the row as it is once locked: a message of the key
			-- checked meanwhile keeps it
			AND touched_at < now() - $2::interval
			RETURNING touched_at)
		SELECT count(*), max(touched_at) FROM gone`, in.cfg.RetentionBatch, in.cfg.Consumer, in.cfg.Retention, in.cfg.RetentionBatch); err != nil {
		return total, fmt.Errorf("inbox: sweeping key sequences: %w", err)
	}
	return total, nil
}

// sweepable is the condition on an inbox row m that the sweep deletes it,
// and that a partition's rows meet before it is dropped: past retention ($2)
// and not parked; with Config.LogStart ($3), each topic's ($4) partition's
// ($5) log start ($6) past the highest offset of its copies. By age alone:
// rows without an offset (not read from Kafka, or from before migration
// 003), with copies on several partitions (-1), or of a topic LogStart does
// not report (one no longer consumed).
const sweepable = `m.processed_at < now() - $2::interval
	AND m.status <> 'parked' -- not applied yet: it waits for its key's release (hold.go)
	AND (NOT $3 OR m.kafka_offset IS NULL OR m.kafka_partition = -1 OR NOT m.topic = ANY($4) OR EXISTS (
		SELECT 1 FROM unnest($4::text[], $5::int[], $6::bigint[]) AS k(topic, part, start)
		WHERE k.topic = m.topic AND k.part = m.kafka_partition AND m.kafka_offset < k.start))`

// logStarts is Config.LogStart's answer as sweepable's parameters.
type logStarts struct {
	on     bool
	topics []string
	parts  []int32
	starts []int64
}

func (in *Inbox) logStarts(ctx context.Context) (logStarts, error) {
	var ls logStarts
	if in.cfg.LogStart == nil {
		return ls, nil
	}
	m, err := in.cfg.LogStart(ctx)
	if err != nil {
		return ls, fmt.Errorf("inbox: sweep: reading Kafka's log-start offsets: %w", err)
	}
	ls.on = true
	for topic, ps := range m {
		for p, start := range ps {
			ls.topics, ls.parts, ls.starts = append(ls.topics, topic), append(ls.parts, p), append(ls.starts, start)
		}
	}
	return ls, nil
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

// sweepPartitions is Sweep's work on a partitioned inbox, once the
// partitions ahead are made: it clears for this consumer the old partitions its rows
// no longer need, drops those every consumer has cleared, and deletes the
// default partition's rows past retention as the unpartitioned sweep does.
func (in *Inbox) sweepPartitions(ctx context.Context, ls logStarts) (dropped []string, err error) {
	p := *in.cfg.Partitions
	now := time.Now()
	parts, err := listPartitions(ctx, in.cfg.Pool)
	if err != nil {
		return nil, err
	}
	for _, part := range parts {
		// A partition can hold a row past retention only once its newest id
		// time is: a message is processed after it is made.
		if part.isDefault() || now.Sub(part.to) < in.cfg.Retention {
			continue
		}
		clear, err := in.clearPartition(ctx, part.name, ls)
		if err != nil {
			return dropped, err
		}
		if !clear {
			continue
		}
		ok, err := dropPartition(ctx, in.cfg.Pool, p, part.name)
		if err != nil {
			return dropped, err
		}
		if ok {
			dropped = append(dropped, part.name)
		}
	}
	return dropped, nil
}

// clearPartition records that this consumer's rows in the partition may all
// go, when its row sweep would delete every one of them, and reports it.
func (in *Inbox) clearPartition(ctx context.Context, name string, ls logStarts) (bool, error) {
	var keep bool
	err := in.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{name}.Sanitize()+` m
		WHERE m.consumer = $1 AND NOT coalesce(`+sweepable+`, false))`,
		in.cfg.Consumer, in.cfg.Retention, ls.on, ls.topics, ls.parts, ls.starts).Scan(&keep)
	if err != nil {
		return false, fmt.Errorf("inbox: reading partition %s: %w", name, err)
	}
	if keep {
		_, err = in.cfg.Pool.Exec(ctx, `DELETE FROM inbox_partitions_cleared WHERE partition = $1 AND consumer = $2`, name, in.cfg.Consumer)
		return false, err
	}
	_, err = in.cfg.Pool.Exec(ctx, `
		INSERT INTO inbox_partitions_cleared (partition, consumer, slack) VALUES ($1, $2, $3)
		ON CONFLICT (partition, consumer) DO UPDATE SET cleared_at = now(), slack = excluded.slack`,
		name, in.cfg.Consumer, clearedSlack(in.cfg.Retention))
	if err != nil {
		return false, fmt.Errorf("inbox: clearing partition %s: %w", name, err)
	}
	return true, nil
}
