package inboxadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// Failure groups. A bad deploy dead-letters thousands of messages with one
// reason that differs only in the ids and numbers it quotes; an operator
// wants to see one line for them, count them, and retry or drop them
// together (Bulk). A group is the open quarantined messages of a consumer
// with the same
//
//   - kind (inbox.KindDeadLetter, inbox.KindPayloadConflict, inbox.KindInvalid),
//   - reason pattern: the reason with its variable parts masked (quoted
//     values become "…", UUIDs and ULIDs <id>, 0x… and runs of eight or
//     more hex digits with a digit and a letter <hex>, numbers <n>),
//   - event type (the outbox's event_type header), and
//   - producer key (pkg/signature's signature_key_id header),
//
// computed by the database as each row is written (migration 007), so the
// groups of a million open rows are one index-only scan.

// Group is one failure group.
type Group struct {
	ID            string // 16 hex digits, its consumer's own; what QuarantineFilter.Group and Selection.Group take
	Consumer      string
	Kind          string
	ReasonPattern string // the reason with its variable parts masked
	EventType     string // "" when the messages had no event_type header
	Producer      string // the signing key's id; "" when unsigned
	Topic         string // the topic of its first message
	Example       string // its first message's reason, as it was
	Count         int64  // open messages in the group
	FirstSeen     time.Time
	LastSeen      time.Time
}

// GroupFilter selects groups for ListGroups.
type GroupFilter struct {
	Consumer  string // empty: every consumer
	Kind      string // empty: every kind
	EventType string // empty: every event type
}

// ListGroups returns the failure groups of the open quarantined messages,
// the largest first.
func (adm *Admin) ListGroups(ctx context.Context, f GroupFilter) ([]Group, error) {
	rows, err := adm.pool.Query(ctx, `
		WITH g AS (
			SELECT consumer, failure_group, count(*) AS n, min(created_at) AS first, max(created_at) AS last, min(id) AS sample
			FROM inbox_quarantine
			WHERE resolved_at IS NULL AND ($1 = '' OR consumer = $1)
			GROUP BY consumer, failure_group)
		SELECT g.failure_group, g.consumer, q.kind, inbox_reason_pattern(q.reason),
			coalesce(q.metadata->>'event_type', ''), coalesce(q.metadata->>'signature_key_id', ''),
			q.topic, q.reason, g.n, g.first, g.last
		FROM g JOIN inbox_quarantine q ON q.id = g.sample
		WHERE ($2 = '' OR q.kind = $2) AND ($3 = '' OR coalesce(q.metadata->>'event_type', '') = $3)
		ORDER BY g.n DESC, g.first, g.consumer, g.failure_group`, schema.PlanEachTime, f.Consumer, f.Kind, f.EventType)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing failure groups: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Group, error) {
		var g Group
		err := row.Scan(&g.ID, &g.Consumer, &g.Kind, &g.ReasonPattern, &g.EventType, &g.Producer,
			&g.Topic, &g.Example, &g.Count, &g.FirstSeen, &g.LastSeen)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: listing failure groups: %w", err)
	}
	return list, nil
}

// GetGroup returns failure group id of consumer, read from that group's
// rows only; ok is false when it holds no open message.
func (adm *Admin) GetGroup(ctx context.Context, consumer, id string) (g Group, ok bool, err error) {
	err = adm.pool.QueryRow(ctx, `
		WITH g AS (
			SELECT count(*) AS n, min(created_at) AS first, max(created_at) AS last, min(id) AS sample
			FROM inbox_quarantine WHERE consumer = $1 AND failure_group = $2 AND resolved_at IS NULL)
		SELECT q.kind, inbox_reason_pattern(q.reason), coalesce(q.metadata->>'event_type', ''),
			coalesce(q.metadata->>'signature_key_id', ''), q.topic, q.reason, g.n, g.first, g.last
		FROM g JOIN inbox_quarantine q ON q.id = g.sample`, consumer, id).Scan(&g.Kind, &g.ReasonPattern, &g.EventType,
		&g.Producer, &g.Topic, &g.Example, &g.Count, &g.FirstSeen, &g.LastSeen)
	if errors.Is(err, pgx.ErrNoRows) {
		return Group{}, false, nil
	}
	if err != nil {
		return Group{}, false, fmt.Errorf("inbox: reading failure group %s: %w", id, err)
	}
	g.ID, g.Consumer = id, consumer
	return g, true, nil
}

// ReasonPattern returns reason with its variable parts masked, as the
// database masks it to group failures: what a Group's ReasonPattern shows.
func (adm *Admin) ReasonPattern(ctx context.Context, reason string) (string, error) {
	var p string
	if err := adm.pool.QueryRow(ctx, `SELECT inbox_reason_pattern($1)`, schema.Text(reason)).Scan(&p); err != nil {
		return "", fmt.Errorf("inbox: masking a reason: %w", err)
	}
	return p, nil
}
