package inboxadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// What a consumer never read because the broker lost it (inbox skipped.go,
// docs/broker-loss.md): the ranges recorded, counted and listed.

// SkippedCounts counts a consumer's skipped ranges since its first, the
// records in them, and the ranges not repaired yet.
type SkippedCounts struct {
	Ranges, Records, Unrepaired int64
}

// Skipped counts consumer's skipped ranges, for metrics.
func (adm *Admin) Skipped(ctx context.Context, consumer string) (SkippedCounts, error) {
	var c SkippedCounts
	err := adm.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(to_offset - from_offset), 0), count(*) FILTER (WHERE repaired_at IS NULL)
		FROM inbox_skipped_ranges WHERE consumer = $1`, consumer).Scan(&c.Ranges, &c.Records, &c.Unrepaired)
	if err != nil {
		return c, fmt.Errorf("inbox: counting skipped ranges: %w", err)
	}
	return c, nil
}

// Skipped is a recorded skipped range.
type Skipped struct {
	Consumer string
	inbox.SkippedRange
	DetectedAt time.Time
	RepairedAt *time.Time
}

// ListSkipped returns the last limit skipped ranges of consumer (of every
// consumer when it is ""), newest first.
func (adm *Admin) ListSkipped(ctx context.Context, consumer string, limit int) ([]Skipped, error) {
	if limit <= 0 {
		return nil, errors.New("inbox: ListSkipped needs a positive limit")
	}
	rows, err := adm.pool.Query(ctx, `
		SELECT consumer, topic, kafka_partition, from_offset, to_offset, cause, detected_at, repaired_at
		FROM inbox_skipped_ranges WHERE $1 = '' OR consumer = $1 ORDER BY detected_at DESC, from_offset DESC LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing skipped ranges: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Skipped, error) {
		var s Skipped
		var cause string
		err := row.Scan(&s.Consumer, &s.Topic, &s.Partition, &s.From, &s.To, &cause, &s.DetectedAt, &s.RepairedAt)
		s.Cause = inbox.SkipCause(cause)
		return s, err
	})
}
