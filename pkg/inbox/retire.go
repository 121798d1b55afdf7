package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Consumers that no longer run. Each consumer's sweep retires its own rows
// (retention.go), and a partition is dropped only when every consumer with
// rows in it has cleared it (partition.go), so the rows of a consumer that
// was renamed or removed stay for ever, and hold every partition they are
// in, until someone retires it.

// ErrConsumerActive is returned by RetireConsumer for a consumer that
// finished with a message within the idle time it was given.
var ErrConsumerActive = errors.New("inbox: the consumer finished with a message recently")

// ConsumerInfo is what the inbox holds for one consumer name.
type ConsumerInfo struct {
	Consumer string
	// LastProcessed is when it last finished with a message (its newest
	// inbox row).
	LastProcessed time.Time
	// OpenQuarantined counts its quarantined messages not yet redriven or
	// discarded; HeldKeys the keys it holds (HoldKey).
	OpenQuarantined, HeldKeys int64
}

// ListConsumers lists every consumer that has rows in the inbox, by name.
// The names are read from the primary key by a skip scan (one probe per
// name); a consumer's newest row costs a scan of the rows written after it,
// so a long-retired consumer beside busy ones takes longest.
func ListConsumers(ctx context.Context, pool *pgxpool.Pool) ([]ConsumerInfo, error) {
	rows, err := pool.Query(ctx, `
		WITH RECURSIVE names AS (
			(SELECT consumer FROM inbox_messages ORDER BY consumer LIMIT 1)
			UNION ALL
			SELECT (SELECT m.consumer FROM inbox_messages m WHERE m.consumer > n.consumer ORDER BY m.consumer LIMIT 1)
			FROM names n WHERE n.consumer IS NOT NULL
		)
		SELECT n.consumer,
			(SELECT max(processed_at) FROM inbox_messages m WHERE m.consumer = n.consumer),
			(SELECT count(*) FROM inbox_quarantine q WHERE q.consumer = n.consumer AND q.resolved_at IS NULL),
			(SELECT count(*) FROM inbox_held_keys h WHERE h.consumer = n.consumer)
		FROM names n WHERE n.consumer IS NOT NULL ORDER BY n.consumer`)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing consumers: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ConsumerInfo, error) {
		var c ConsumerInfo
		return c, row.Scan(&c.Consumer, &c.LastProcessed, &c.OpenQuarantined, &c.HeldKeys)
	})
}

// Retired says what RetireConsumer deleted, and what it left.
type Retired struct {
	Rows, Attempts, HeldKeys, Parked, Clearances int64
	// OpenQuarantined counts the consumer's quarantined messages still open:
	// left in place, as the record of what it did not apply (inboxctl list,
	// DropQuarantined).
	OpenQuarantined int64
}

// retireBatch is how many inbox rows one transaction of RetireConsumer
// deletes.
const retireBatch = 10_000

// RetireConsumer deletes what the inbox keeps for consumer, which no longer
// runs: its inbox rows, its failed attempts, its held keys and the messages
// parked behind them, and its partitions' clearances. Its quarantine stays.
// It refuses (ErrConsumerActive) when the consumer finished with a message
// within idle: under a name still in use, the inbox would forget what it
// applied, and every message Kafka still holds would be applied again.
// Nothing stops a consumer from starting under the name while it runs.
// The rows go in transactions of retireBatch, so a large inbox is retired
// without one long transaction; one stopped midway is finished by running
// it again.
func RetireConsumer(ctx context.Context, pool *pgxpool.Pool, consumer string, idle time.Duration) (Retired, error) {
	var r Retired
	if consumer == "" {
		return r, errors.New("inbox: RetireConsumer: no consumer named")
	}
	var last *time.Time
	if err := pool.QueryRow(ctx, `SELECT max(processed_at) FROM inbox_messages WHERE consumer = $1`, consumer).Scan(&last); err != nil {
		return r, fmt.Errorf("inbox: reading %s's newest row: %w", consumer, err)
	}
	if last != nil && time.Since(*last) < idle {
		return r, fmt.Errorf("%w: %s finished with a message %s ago, within the %s it must be idle",
			ErrConsumerActive, consumer, time.Since(*last).Round(time.Second), idle)
	}
	for {
		var n int64
		err := pool.QueryRow(ctx, `
			WITH gone AS (
				DELETE FROM inbox_messages WHERE consumer = $1 AND message_id IN (
					SELECT message_id FROM inbox_messages WHERE consumer = $1 LIMIT $2)
				RETURNING 1)
			SELECT count(*) FROM gone`, consumer, retireBatch).Scan(&n)
		if err != nil {
			return r, fmt.Errorf("inbox: deleting %s's rows (%d deleted so far): %w", consumer, r.Rows, err)
		}
		r.Rows += n
		if n == 0 {
			break
		}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, d := range []struct {
			count *int64
			sql   string
		}{
			{&r.Attempts, `DELETE FROM inbox_attempts WHERE consumer = $1`},
			{&r.Parked, `DELETE FROM inbox_parked WHERE consumer = $1`},
			{&r.HeldKeys, `DELETE FROM inbox_held_keys WHERE consumer = $1`},
		} {
			tag, err := tx.Exec(ctx, d.sql, consumer)
			if err != nil {
				return err
			}
			*d.count = tag.RowsAffected()
		}
		var partitioned bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass('inbox_partitions_cleared') IS NOT NULL`).Scan(&partitioned); err != nil {
			return err
		}
		if partitioned {
			tag, err := tx.Exec(ctx, `DELETE FROM inbox_partitions_cleared WHERE consumer = $1`, consumer)
			if err != nil {
				return err
			}
			r.Clearances = tag.RowsAffected()
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM inbox_quarantine WHERE consumer = $1 AND resolved_at IS NULL`,
			consumer).Scan(&r.OpenQuarantined)
	})
	if err != nil {
		return r, fmt.Errorf("inbox: retiring %s: %w", consumer, err)
	}
	return r, nil
}
