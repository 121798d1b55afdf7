package outboxadmin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sending again what the broker lost (docs/broker-loss.md): the outbox
// keeps every row it published for its retention, under the message id it
// was sent with. Republish marks the rows a filter selects unpublished; the
// relay sends them again in their order (per key, commit order), and each
// consumer's inbox applies what it never got and suppresses what it had.

// RepublishFilter selects the published rows Republish sends again.
type RepublishFilter struct {
	Topic string // required
	// Since and Until bound when the rows were published: [Since, Until).
	// Both required: a loss has a window (the skipped range's records were
	// written within it), and rows older than the outbox's retention are
	// gone anyway.
	Since, Until time.Time
	Key          string // only this partition key; "": every key
}

func (f RepublishFilter) check() error {
	switch {
	case f.Topic == "":
		return errors.New("outbox: a republish needs its topic")
	case f.Since.IsZero() || f.Until.IsZero() || !f.Until.After(f.Since):
		return fmt.Errorf("outbox: a republish needs Since before Until (got %s, %s)", f.Since, f.Until)
	}
	return nil
}

// republishWhere is the rows f selects, its parameters $1 to $4: topic,
// since, until, key. Parked and unsent rows are not published: left alone.
const republishWhere = `FROM outbox_messages WHERE topic = $1 AND published_at >= $2 AND published_at < $3 AND ($4 = '' OR partition_key = $4)`

// CountRepublish counts the rows Republish would send again for f: its dry run.
func (adm *Admin) CountRepublish(ctx context.Context, f RepublishFilter) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	var n int64
	if err := adm.pool.QueryRow(ctx, `SELECT count(*) `+republishWhere, f.Topic, f.Since, f.Until, f.Key).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: counting rows to republish: %w", err)
	}
	return n, nil
}

// Republish marks the rows f selects unpublished, so that the relay sends
// them again, and records who asked and why (outbox_republishes), in one
// transaction; it returns how many rows it marked. by and why are
// required: they are the record.
func (adm *Admin) Republish(ctx context.Context, f RepublishFilter, by, why string) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, adm.pool, func(tx pgx.Tx) (err error) {
		n, err = adm.RepublishTx(ctx, tx, f, by, why)
		return err
	})
	return n, err
}

// RepublishTx is Republish in tx.
func (adm *Admin) RepublishTx(ctx context.Context, tx pgx.Tx, f RepublishFilter, by, why string) (int64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if strings.TrimSpace(by) == "" || strings.TrimSpace(why) == "" {
		return 0, errors.New("outbox: Republish needs who asks and why: they are its record")
	}
	var n int64
	err := tx.QueryRow(ctx, `
		WITH again AS (
			UPDATE outbox_messages SET published_at = NULL
			WHERE id IN (SELECT id `+republishWhere+`)
			RETURNING id)
		INSERT INTO outbox_republishes (topic, partition_key, published_from, published_to, row_count, requested_by, reason)
		SELECT $1, nullif($4, ''), $2, $3, count(*), $5, $6 FROM again
		RETURNING row_count`, f.Topic, f.Since, f.Until, f.Key, by, why).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: republishing: %w", err)
	}
	// Wake the relays (outbox.PublishTx's channel): the rows go now, not at
	// the next poll.
	if _, err := tx.Exec(ctx, `SELECT pg_notify('outbox_' || md5(current_schema()), '')`); err != nil {
		return 0, fmt.Errorf("outbox: waking the relay: %w", err)
	}
	return n, nil
}

// Republished is a recorded republish.
type Republished struct {
	ID int64
	RepublishFilter
	Rows        int64
	By, Why     string
	RequestedAt time.Time
}

// ListRepublishes returns the last limit republishes, newest first.
func (adm *Admin) ListRepublishes(ctx context.Context, limit int) ([]Republished, error) {
	if limit <= 0 {
		return nil, errors.New("outbox: ListRepublishes needs a positive limit")
	}
	rows, err := adm.pool.Query(ctx, `SELECT id, topic, coalesce(partition_key, ''), published_from, published_to, row_count, requested_by, reason, requested_at
		FROM outbox_republishes ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing republishes: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Republished, error) {
		var r Republished
		return r, row.Scan(&r.ID, &r.Topic, &r.Key, &r.Since, &r.Until, &r.Rows, &r.By, &r.Why, &r.RequestedAt)
	})
}
