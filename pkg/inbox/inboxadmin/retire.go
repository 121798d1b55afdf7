package inboxadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// Consumers that no longer run. Each consumer's sweep retires its own rows
// (retention.go), and a partition is dropped only when every consumer with
// rows in it has cleared it (partition.go), so the rows of a consumer that
// was renamed or removed stay for ever, and hold every partition they are
// in, until someone retires it.

var (
	// ErrConsumerActive is returned by Retire for a consumer that
	// wrote to the inbox within the idle time it was given.
	ErrConsumerActive = errors.New("inbox: the consumer wrote to the inbox recently")
	// ErrNoSuchConsumer is returned by Retire for a name with
	// nothing to retire: a typo, or a consumer already retired.
	ErrNoSuchConsumer = errors.New("inbox: nothing to retire under that consumer name")
	// ErrParkedMessages is returned by Retire for a consumer with
	// parked messages, unless told to drop them: they were never applied,
	// and the inbox may hold the only copy.
	ErrParkedMessages = errors.New("inbox: the consumer has parked messages")
)

// ConsumerInfo is what the inbox holds for one consumer name.
type ConsumerInfo struct {
	Consumer string
	// LastProcessed is when it last finished with a message (its newest
	// inbox row); nil when it has no inbox row left.
	LastProcessed *time.Time
	// OpenQuarantined counts its quarantined messages not yet redriven or
	// discarded, HeldKeys the keys it holds (inbox.HoldKey), Parked the messages
	// parked behind them.
	OpenQuarantined, HeldKeys, Parked int64
}

// ListConsumers lists, by name, every consumer with rows in the inbox, an
// open quarantined message, a held key or a parked message. The names in
// inbox_messages are read from its primary key by a skip scan (one probe
// per name); a consumer's newest row costs a scan of the rows written after
// it, so a long-retired consumer beside busy ones takes longest.
func (adm *Admin) ListConsumers(ctx context.Context) ([]ConsumerInfo, error) {
	rows, err := adm.pool.Query(ctx, `
		WITH RECURSIVE names AS (
			(SELECT consumer FROM inbox_messages ORDER BY consumer LIMIT 1)
			UNION ALL
			SELECT (SELECT m.consumer FROM inbox_messages m WHERE m.consumer > n.consumer ORDER BY m.consumer LIMIT 1)
			FROM names n WHERE n.consumer IS NOT NULL
		), every AS (
			SELECT consumer FROM names WHERE consumer IS NOT NULL
			UNION SELECT consumer FROM inbox_quarantine WHERE resolved_at IS NULL
			UNION SELECT consumer FROM inbox_held_keys
			UNION SELECT consumer FROM inbox_parked
		)
		SELECT e.consumer,
			(SELECT max(processed_at) FROM inbox_messages m WHERE m.consumer = e.consumer),
			(SELECT count(*) FROM inbox_quarantine q WHERE q.consumer = e.consumer AND q.resolved_at IS NULL),
			(SELECT count(*) FROM inbox_held_keys h WHERE h.consumer = e.consumer),
			(SELECT count(*) FROM inbox_parked p WHERE p.consumer = e.consumer)
		FROM every e ORDER BY e.consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing consumers: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConsumerInfo, error) {
		var c ConsumerInfo
		return c, row.Scan(&c.Consumer, &c.LastProcessed, &c.OpenQuarantined, &c.HeldKeys, &c.Parked)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: listing consumers: %w", err)
	}
	return list, nil
}

// RetireParams says which consumer Retire retires, and how.
type RetireParams struct {
	// Consumer is the name of the consumer that no longer runs. Required.
	Consumer string
	// Idle is how long the consumer must not have written to the inbox (a
	// row, a failed attempt, a hold, a parked message): under a name still
	// in use, the inbox would forget what it applied, and a redelivery or
	// a relay's republished batch would be applied again. Keep it above
	// the consumer's RedeliveryHorizon. 0 checks nothing.
	Idle time.Duration
	// DropParked retires a consumer that has parked messages, deleting
	// them. They were never applied, and the inbox may hold the only copy:
	// look at them first (inboxctl held -consumer NAME).
	DropParked bool
	// Progress, if set, is called after each transaction of deleted rows,
	// with the rows deleted so far.
	Progress func(rows int64)
}

// Retired says what Retire deleted, and what it left.
type Retired struct {
	// Rows counts the inbox rows deleted, Attempts the failed attempts of
	// messages it never finished with, HeldKeys and Parked its holds and
	// the messages parked behind them, Clearances the partitions it had
	// cleared, KeySequences its continuity state (inbox continuity.go; its
	// breaches stay, a record like the quarantine).
	Rows, Attempts, HeldKeys, Parked, Clearances, KeySequences int64
	// OpenQuarantined counts its quarantined messages still open: left in
	// place, as the record of what it did not apply. Discard them
	// (Drop): a redrive would write them back to a topic only
	// other consumers read.
	OpenQuarantined int64
}

// retireBatch is how many inbox rows one transaction of Retire
// deletes.
const retireBatch = 10_000

// Retire deletes what the inbox keeps for a consumer that no longer
// runs (r.Consumer): its inbox rows, its failed attempts, its held keys and
// parked messages (only with r.DropParked when there are parked messages:
// ErrParkedMessages), and its partitions' clearances; its quarantine stays.
// It refuses a consumer that wrote to the inbox within r.Idle
// (ErrConsumerActive) and a name with nothing to retire
// (ErrNoSuchConsumer). Nothing stops a consumer from starting under the
// name while it runs: stop it first. The rows go in transactions of
// retireBatch, walking the primary key, so a large inbox is retired without
// one long transaction and without visiting the rows already deleted; one
// stopped midway is finished by running it again.
func (adm *Admin) Retire(ctx context.Context, r RetireParams) (Retired, error) {
	var res Retired
	switch {
	case r.Consumer == "":
		return res, errors.New("inbox: Retire needs the consumer's name")
	case r.Idle < 0:
		return res, fmt.Errorf("inbox: Retire: a negative Idle (%s)", r.Idle)
	}
	if err := adm.retirable(ctx, r); err != nil {
		return res, err
	}
	var err error
	if res.Rows, err = adm.deleteRows(ctx, r); err != nil {
		return res, err
	}
	err = pgx.BeginFunc(ctx, adm.pool, func(tx pgx.Tx) error { return deleteTheRest(ctx, tx, r.Consumer, &res) })
	if err != nil {
		return res, fmt.Errorf("inbox: retiring %s: %w", r.Consumer, err)
	}
	return res, nil
}

// retirable refuses a consumer with nothing to retire, one that wrote
// within r.Idle, and one with parked messages unless r.DropParked.
func (adm *Admin) retirable(ctx context.Context, r RetireParams) error {
	var found, active bool
	var parked int64
	err := adm.pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM inbox_messages WHERE consumer = $1)
		    OR EXISTS (SELECT 1 FROM inbox_attempts WHERE consumer = $1)
		    OR EXISTS (SELECT 1 FROM inbox_held_keys WHERE consumer = $1)
		    OR EXISTS (SELECT 1 FROM inbox_parked WHERE consumer = $1),
		  coalesce(greatest(
			(SELECT max(processed_at) FROM inbox_messages WHERE consumer = $1 AND processed_at > now() - $2::interval),
			(SELECT max(updated_at) FROM inbox_attempts WHERE consumer = $1),
			(SELECT max(updated_at) FROM inbox_held_keys WHERE consumer = $1),
			(SELECT max(parked_at) FROM inbox_parked WHERE consumer = $1)) > now() - $2::interval, false),
		  (SELECT count(*) FROM inbox_parked WHERE consumer = $1)`,
		schema.PlanEachTime, r.Consumer, r.Idle).Scan(&found, &active, &parked)
	switch {
	case err != nil:
		return fmt.Errorf("inbox: reading what %s keeps: %w", r.Consumer, err)
	case !found:
		return fmt.Errorf("%w: no inbox row, attempt, hold or parked message of %q", ErrNoSuchConsumer, r.Consumer)
	case active:
		return fmt.Errorf("%w: %s wrote to the inbox within the last %s", ErrConsumerActive, r.Consumer, r.Idle)
	case parked > 0 && !r.DropParked:
		return fmt.Errorf("%w: %d of %s's messages are parked behind its held keys, never applied", ErrParkedMessages, parked, r.Consumer)
	}
	return nil
}

// deleteRows deletes r.Consumer's inbox rows in transactions of
// retireBatch, walking the primary key, and returns how many.
func (adm *Admin) deleteRows(ctx context.Context, r RetireParams) (deleted int64, err error) {
	var after *string // the last batch's highest id
	for {
		var n, taken int64
		var last *string
		// One batch: the next ids in key order after the last batch's,
		// planned for the table as it is now.
		err := adm.pool.QueryRow(ctx, `
			WITH batch AS MATERIALIZED (
				SELECT message_id FROM inbox_messages WHERE consumer = $1 AND ($2::text IS NULL OR message_id > $2)
				ORDER BY message_id LIMIT $3
			), gone AS (
				DELETE FROM inbox_messages m USING batch b WHERE m.consumer = $1 AND m.message_id = b.message_id
				RETURNING 1
			)
			SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM batch), (SELECT max(message_id) FROM batch)`,
			schema.PlanEachTime, r.Consumer, after, retireBatch).Scan(&n, &taken, &last)
		if err != nil {
			return deleted, fmt.Errorf("inbox: deleting %s's rows (%d deleted so far; run it again to go on): %w", r.Consumer, deleted, err)
		}
		deleted += n
		if r.Progress != nil && n > 0 {
			r.Progress(deleted)
		}
		if taken < retireBatch {
			break
		}
		after = last
	}
	return deleted, nil
}

// deleteTheRest deletes, in tx, what else the inbox keeps for consumer:
// its attempts, holds, parked messages, continuity state, redrive topic and
// clearances; and counts its quarantine still open, which stays.
func deleteTheRest(ctx context.Context, tx pgx.Tx, consumer string, res *Retired) error {
	for _, d := range []struct {
		count *int64
		sql   string
	}{
		{&res.Attempts, `DELETE FROM inbox_attempts WHERE consumer = $1`},
		{&res.Parked, `DELETE FROM inbox_parked WHERE consumer = $1`},
		{&res.HeldKeys, `DELETE FROM inbox_held_keys WHERE consumer = $1`},
		{&res.KeySequences, `DELETE FROM inbox_key_sequences WHERE consumer = $1`},
	} {
		tag, err := tx.Exec(ctx, d.sql, consumer)
		if err != nil {
			return err
		}
		*d.count = tag.RowsAffected()
	}
	// Where its redrives went (inbox.Inbox.Run records it): a retired
	// consumer takes none.
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_consumers WHERE consumer = $1`, consumer); err != nil {
		return err
	}
	partitioned, err := schema.Partitioned(ctx, tx) // PartitionByIDTime made the clearances' table with the partitions
	if err != nil {
		return err
	}
	if partitioned {
		tag, err := tx.Exec(ctx, `DELETE FROM inbox_partitions_cleared WHERE consumer = $1`, consumer)
		if err != nil {
			return err
		}
		res.Clearances = tag.RowsAffected()
	}
	return tx.QueryRow(ctx, `SELECT count(*) FROM inbox_quarantine WHERE consumer = $1 AND resolved_at IS NULL`,
		consumer).Scan(&res.OpenQuarantined)
}
