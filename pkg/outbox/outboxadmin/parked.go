// Package outboxadmin is the operator's side of pkg/outbox: the rows the
// relay parked, listed, retried or dropped. The relay (package outbox)
// parks a row the broker will never take, and holds its key's later rows
// behind it; what to do with it is a person's call. And the rows a
// broker lost after the relay sent them, sent again (Republish).
//
//	adm := outboxadmin.New(pool)
//	parked, err := adm.ListParked(ctx, outboxadmin.ParkedFilter{Limit: 50})
//	// ... raise the broker's limit, then
//	err = adm.Retry(ctx, parked[0].ID)
//	// or give up on it, with who and why:
//	err = adm.Drop(ctx, parked[0].ID, "ana", "superseded by order 42's correction")
package outboxadmin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Admin is the operator's hand on the outbox of one database.
type Admin struct {
	pool *pgxpool.Pool
}

// New returns an Admin that works through pool.
func New(pool *pgxpool.Pool) *Admin { return &Admin{pool: pool} }

// ParkedRow is a parked outbox row.
type ParkedRow struct {
	ID        int64 // the outbox row's id: what Retry and Drop take
	MessageID string
	Topic     string
	Key       string // the partition key
	Payload   []byte
	Metadata  message.Metadata
	CreatedAt time.Time
	ParkedAt  time.Time
	Reason    string
	Waiting   int // rows of the same topic and key waiting behind it
}

// ErrNotParked is returned by Retry and Drop for an id that is not a parked
// row (never was, or already retried or dropped).
var ErrNotParked = errors.New("outbox: no parked row with that id")

// ParkedFilter selects the parked rows ListParked returns.
type ParkedFilter struct {
	// After lists the rows after this id: the next page after a page whose
	// last row had it.
	After int64
	// Limit caps the rows returned, oldest first. 0: all of them.
	Limit int
}

// ListParked lists the parked rows f selects, oldest first.
func (adm *Admin) ListParked(ctx context.Context, f ParkedFilter) ([]ParkedRow, error) {
	rows, err := adm.pool.Query(ctx, `
		SELECT p.id, p.message_id::text, p.topic, p.partition_key, p.payload, p.metadata,
		       p.created_at, p.parked_at, p.park_reason,
		       CASE WHEN p.partition_key = '' THEN 0 ELSE (
		           SELECT count(*) FROM outbox_messages w
		           WHERE w.published_at IS NULL AND w.parked_at IS NULL
		             AND w.topic = p.topic AND w.partition_key = p.partition_key AND w.id > p.id) END
		FROM outbox_messages p
		WHERE p.parked_at IS NOT NULL AND p.id > $1
		ORDER BY p.id LIMIT nullif($2, 0)`, f.After, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked rows: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		var meta []byte
		err := row.Scan(&p.ID, &p.MessageID, &p.Topic, &p.Key, &p.Payload, &meta,
			&p.CreatedAt, &p.ParkedAt, &p.Reason, &p.Waiting)
		if err == nil {
			err = json.Unmarshal(meta, &p.Metadata)
		}
		return p, err
	})
}

// Retry unparks row id: the relay sends it again with the next batch, and
// its key's waiting rows go out after it. Fix what refused it first (the
// broker's max.message.bytes, the producer's limit), or it is parked again.
func (adm *Admin) Retry(ctx context.Context, id int64) error { return retry(ctx, adm.pool, id) }

// RetryTx is Retry in tx: for a caller that records what it did in the
// same transaction (inboxadmin.Admin.RunBulk).
func (adm *Admin) RetryTx(ctx context.Context, tx pgx.Tx, id int64) error { return retry(ctx, tx, id) }

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func retry(ctx context.Context, db execer, id int64) error {
	tag, err := db.Exec(ctx, `
		UPDATE outbox_messages SET parked_at = NULL, park_reason = NULL
		WHERE id = $1 AND parked_at IS NOT NULL`, id)
	if err != nil {
		return fmt.Errorf("outbox: retrying row %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrNotParked, id)
	}
	return nil
}

// Drop gives up on parked row id: it moves to outbox_dropped with by, why
// and the time, and its key's waiting rows go out without it. Consumers
// never see the message, and its number is missing from its key's history:
// the next message of the key shows them a gap (inbox continuity, alert
// InboxGap); why should say what was done instead.
func (adm *Admin) Drop(ctx context.Context, id int64, by, why string) error {
	return drop(ctx, adm.pool, id, by, why)
}

// DropTx is Drop in tx.
func (adm *Admin) DropTx(ctx context.Context, tx pgx.Tx, id int64, by, why string) error {
	return drop(ctx, tx, id, by, why)
}

func drop(ctx context.Context, db execer, id int64, by, why string) error {
	if strings.TrimSpace(by) == "" || strings.TrimSpace(why) == "" {
		return errors.New("outbox: Drop needs who drops the row and why: they are its audit record")
	}
	tag, err := db.Exec(ctx, `
		WITH gone AS (
			DELETE FROM outbox_messages WHERE id = $1 AND parked_at IS NOT NULL
			RETURNING id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason)
		INSERT INTO outbox_dropped (id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason, dropped_by, drop_reason)
		SELECT id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason, $2, $3 FROM gone`,
		id, by, why)
	if err != nil {
		return fmt.Errorf("outbox: dropping row %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrNotParked, id)
	}
	return nil
}
