package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
)

// What a consumer never read because the broker lost it: Kafka deleted the
// records before the consumer got to them (retention under a consumer
// that was down, kafka-delete-records), or its log ends below what the
// consumer had committed (the topic deleted and created again, an unclean
// leader election). The inbox cannot see either in the messages it gets:
// the messages are gone. The consumer's reader can, in the offsets
// (inboxkafka.Watchdog), and records what it saw here, in the consumer's
// database, where an operator, a metric and the repair find it
// (docs/broker-loss.md).

// SkipCause is why a range of records was never read.
type SkipCause string

// The causes of a skipped range.
const (
	// Deleted: the partition's log start passed the committed offset:
	// the records in between were deleted before the consumer read them.
	Deleted SkipCause = "deleted"
	// Truncated: the partition's log ends below the committed offset: the
	// records the consumer had read up to it are gone from the log, and
	// what other consumers had not read of them with it.
	Truncated SkipCause = "truncated"
)

// SkippedRange is a range of offsets [From, To) of one partition of Topic
// that the consumer never read, or that its log no longer holds.
type SkippedRange struct {
	Topic     string
	Partition int32
	From, To  int64
	Cause     SkipCause
}

func (r SkippedRange) String() string {
	if r.Cause == Truncated {
		return fmt.Sprintf("%s/%d: offsets %d to %d are no longer in the log (its end fell below the committed offset %d: the topic recreated, or an unclean leader election)",
			r.Topic, r.Partition, r.From, r.To-1, r.To)
	}
	return fmt.Sprintf("%s/%d: %d records (offsets %d to %d) were deleted before the consumer read them (retention, or kafka-delete-records)",
		r.Topic, r.Partition, r.To-r.From, r.From, r.To-1)
}

// RecordSkipped records r in the consumer's database (inbox_skipped_ranges)
// and logs it, once: a range seen again is not recorded twice, and one that
// overlaps or touches a range recorded before (its log start moved on, or
// another process of the consumer saw it from a committed offset a little
// lower) widens that one, logged again with its new bounds. It reports
// whether r was new or widened a range.
func (in *Inbox) RecordSkipped(ctx context.Context, r SkippedRange) (bool, error) {
	switch {
	case r.Topic == "" || r.From < 0 || r.To <= r.From:
		return false, fmt.Errorf("inbox: a skipped range needs a topic and From < To: %+v", r)
	case r.Cause != Deleted && r.Cause != Truncated:
		return false, fmt.Errorf("inbox: a skipped range's cause is %q or %q, not %q", Deleted, Truncated, r.Cause)
	}
	var changed bool
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
		// One writer at a time per partition: two readings that widen the
		// same range take turns.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('inbox_skipped_ranges' || $1 || $2), $3)`,
			in.cfg.Consumer, r.Topic, r.Partition); err != nil {
			return err
		}
		var from, to int64
		err := tx.QueryRow(ctx, `SELECT from_offset, to_offset FROM inbox_skipped_ranges
			WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 AND from_offset <= $5 AND to_offset >= $4
			ORDER BY from_offset LIMIT 1`, in.cfg.Consumer, r.Topic, r.Partition, r.From, r.To).Scan(&from, &to)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			changed = true
			_, err = tx.Exec(ctx, `INSERT INTO inbox_skipped_ranges (consumer, topic, kafka_partition, from_offset, to_offset, cause)
				VALUES ($1, $2, $3, $4, $5, $6)`, in.cfg.Consumer, r.Topic, r.Partition, r.From, r.To, string(r.Cause))
			return err
		case err != nil:
			return err
		case from <= r.From && to >= r.To:
			return nil // seen before
		}
		changed = true
		r.From, r.To = min(from, r.From), max(to, r.To)
		_, err = tx.Exec(ctx, `UPDATE inbox_skipped_ranges SET from_offset = $5, to_offset = $6, updated_at = now(), repaired_at = NULL
			WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 AND from_offset = $4`,
			in.cfg.Consumer, r.Topic, r.Partition, from, r.From, r.To)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("inbox: recording skipped records: %w", err)
	}
	if changed {
		in.cfg.log.Error("Inbox's consumer never read records the broker lost", errors.New(r.String()), watermill.LogFields{
			"consumer": in.cfg.Consumer, "topic": r.Topic, "partition": r.Partition, "from_offset": r.From, "to_offset": r.To, "cause": string(r.Cause)})
	}
	return changed, nil
}
