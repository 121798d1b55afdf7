package inboxadmin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// What a consumer's continuity checks found (inbox continuity.go): the
// breaches it recorded, counted and listed.

// ContinuityCounts counts a consumer's breaches by kind, since its first,
// and the late messages that filled gaps.
type ContinuityCounts struct {
	Gaps, Rewinds, Late int64
}

// Continuity counts consumer's continuity breaches, for metrics.
func (adm *Admin) Continuity(ctx context.Context, consumer string) (ContinuityCounts, error) {
	var c ContinuityCounts
	err := adm.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'gap'), count(*) FILTER (WHERE kind = 'rewind'),
			count(*) FILTER (WHERE kind = 'late')
		FROM inbox_continuity_breaches WHERE consumer = $1`, consumer).Scan(&c.Gaps, &c.Rewinds, &c.Late)
	if err != nil {
		return c, fmt.Errorf("inbox: counting continuity breaches: %w", err)
	}
	return c, nil
}

// ListBreaches returns the last limit continuity breaches of consumer (of
// every consumer when it is ""), newest first.
func (adm *Admin) ListBreaches(ctx context.Context, consumer string, limit int) ([]inbox.Breach, error) {
	if limit <= 0 {
		return nil, errors.New("inbox: ListBreaches needs a positive limit")
	}
	rows, err := adm.pool.Query(ctx, `
		SELECT consumer, kind, topic, partition_key, stream::text, expected, got, message_id, previous_id, detected_at
		FROM inbox_continuity_breaches WHERE $1 = '' OR consumer = $1 ORDER BY id DESC LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing continuity breaches: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[inbox.Breach])
}
