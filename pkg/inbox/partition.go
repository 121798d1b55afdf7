package inbox

// A time-partitioned inbox_messages (Config.Partitions): the table is
// partitioned by the time in each message's id, the same for every copy of
// a message, so the copies of one message meet in one partition and its
// unique index. Retention drops whole partitions instead of deleting rows
// (docs/partitioning.md has the design and what was checked on Postgres).
//
// The partitions, by id time:
//
//	inbox_messages_before_cut   MINVALUE .. the cut-over: the table as it was
//	                            before PartitionByIDTime, rows and indexes kept
//	inbox_messages_pYYYYMMDDtHHMM  one Interval each, made Ahead in advance
//	inbox_messages_default      ids older than every partition kept (a
//	                            redriven dead letter), or newer than those made
//
// A partition is dropped once every consumer with rows in it has cleared it
// (inbox_partitions_cleared: each consumer judges its own rows, as its
// row sweep would, against its own Retention and Kafka log starts), and no
// row in it was written since.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/internal/pgtable"
)

// The tables of a partitioned inbox besides the partitions.
const (
	partitionBeforeCut = "inbox_messages_before_cut"
	partitionDefault   = "inbox_messages_default"
)

// partitionName names the partition of id times from start.
func partitionName(start time.Time) string {
	return "inbox_messages_p" + start.UTC().Format("20060102t1504")
}

// PartitionByIDTime converts inbox_messages into a table partitioned by the
// time in each message's id (Partitioning.Time), in place: the table as it
// is becomes the partition of every id time before cutOver (rounded up to a
// partition boundary), its rows not copied, and partitions are made from
// there. Run Migrate first. A table already partitioned is left as it is
// (the partitions ahead are made, as Sweep makes them).
//
// Every consumer that writes the table must run with Config.Partitions set
// before the cut-over passes: a consumer without it writes its rows with no
// time, into the first partition, where a copy that a converted consumer
// wrote into a later partition would not meet them. The default cut-over,
// the zero time, is the start of the partition after the next one.
//
// It builds two unique indexes concurrently (writes go on meanwhile), checks
// the cut-over against the table with a scan that does not block writes,
// and then takes the table's lock for one short transaction.
func PartitionByIDTime(ctx context.Context, pool *pgxpool.Pool, p Partitioning, cutOver time.Time) error {
	p.setDefaults()
	if err := p.validate(); err != nil {
		return err
	}
	if cutOver.IsZero() {
		cutOver = pgtable.FloorTo(time.Now(), p.Interval).Add(2 * p.Interval)
	} else if f := pgtable.FloorTo(cutOver, p.Interval); !f.Equal(cutOver) {
		cutOver = f.Add(p.Interval)
	}
	if err := convertOnce(ctx, pool, p, cutOver); err != nil {
		return err
	}
	_, err := makePartitions(ctx, pool, p, time.Now())
	return err
}

// convertOnce converts the table unless it is partitioned, holding a lock
// that makes replicas starting together convert it once.
func convertOnce(ctx context.Context, pool *pgxpool.Pool, p Partitioning, cutOver time.Time) error {
	const what = "inbox: partitioning inbox_messages"
	return pgtable.WithSessionLock(ctx, pool, what, `hashtext('inbox: PartitionByIDTime')`, nil, true, func(conn *pgxpool.Conn) error {
		partitioned, err := schema.Partitioned(ctx, conn)
		if err != nil || partitioned {
			return err
		}
		if err := convert(ctx, conn, p, cutOver); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

// convert runs the steps of PartitionByIDTime on an unpartitioned table.
func convert(ctx context.Context, pool pgtable.DB, p Partitioning, cutOver time.Time) error {
	steps := []string{
		// Instant: a constant default rewrites nothing. Old rows, and rows a
		// consumer without Config.Partitions writes, sort before any time.
		`ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS msg_time timestamptz NOT NULL DEFAULT '-infinity'`,
		// The old key stays unique on its own in the first partition: a copy
		// of an old message, written after the cut-over with its id's time
		// (before the cut-over), meets its row there.
		`CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_once ON inbox_messages (consumer, message_id)`,
		// The partitioned table's key, built beforehand so attaching the
		// table does not build it under the lock.
		`CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_key ON inbox_messages (consumer, message_id, msg_time)`,
		// Attaching checks every row is in the partition's range unless a
		// validated constraint says so; validating does not block writes.
		`ALTER TABLE inbox_messages DROP CONSTRAINT IF EXISTS inbox_messages_before_cut`,
		fmt.Sprintf(`ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_before_cut CHECK (msg_time < %s) NOT VALID`, quoteTime(cutOver)),
		`ALTER TABLE inbox_messages VALIDATE CONSTRAINT inbox_messages_before_cut`,
	}
	// Deliveries queue behind a step that waits for the table's lock (a
	// long transaction holding it): wait a few seconds at most, and fail.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`SET lock_timeout = %d`, max(p.LockTimeout, 5*time.Second).Milliseconds())); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`) //nolint:errcheck // the connection goes back to the pool
	for _, s := range steps {
		if err := dropInvalidIndexes(ctx, pool); err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", pgtable.FirstLine(s), err)
		}
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cut := []string{
			fmt.Sprintf(`SET LOCAL lock_timeout = %d`, max(p.LockTimeout, 5*time.Second).Milliseconds()),
			`LOCK TABLE inbox_messages IN ACCESS EXCLUSIVE MODE`,
			`ALTER TABLE inbox_messages DROP CONSTRAINT inbox_messages_pkey`,
			`ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_key PRIMARY KEY USING INDEX inbox_messages_key`,
			`ALTER TABLE inbox_messages RENAME TO ` + partitionBeforeCut,
			`ALTER INDEX inbox_messages_processed_at RENAME TO ` + partitionBeforeCut + `_processed_at`,
			`CREATE TABLE inbox_messages (LIKE ` + partitionBeforeCut + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (msg_time)`,
			`ALTER TABLE inbox_messages DROP CONSTRAINT inbox_messages_before_cut`,
			`ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_pkey PRIMARY KEY (consumer, message_id, msg_time)`,
			`CREATE INDEX inbox_messages_processed_at ON inbox_messages (processed_at)`,
			fmt.Sprintf(`ALTER TABLE inbox_messages ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%s)`, partitionBeforeCut, quoteTime(cutOver)),
			`CREATE TABLE ` + partitionDefault + ` PARTITION OF inbox_messages DEFAULT`,
			`CREATE TABLE IF NOT EXISTS inbox_partitions_cleared (
				partition  text        NOT NULL,
				consumer   text        NOT NULL,
				cleared_at timestamptz NOT NULL DEFAULT now(),
				slack      interval    NOT NULL, -- the consumer's clearedSlack
				PRIMARY KEY (partition, consumer))`,
		}
		for _, s := range cut {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", pgtable.FirstLine(s), err)
			}
		}
		// The roles consumers log in as keep their access, to the new table
		// and to the clearances their sweeps write.
		for _, to := range []string{"inbox_messages", "inbox_partitions_cleared"} {
			if err := pgtable.CopyGrants(ctx, tx, partitionBeforeCut, to); err != nil {
				return err
			}
		}
		return nil
	})
}

// dropInvalidIndexes drops what a CREATE INDEX CONCURRENTLY that failed
// left behind, so that the step runs again instead of finding it there.
func dropInvalidIndexes(ctx context.Context, pool pgtable.DB) error {
	rows, err := pool.Query(ctx, `
		SELECT i.indexrelid::regclass::text FROM pg_index i
		WHERE i.indrelid = 'inbox_messages'::regclass AND NOT i.indisvalid`)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := pool.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+pgx.Identifier{n}.Sanitize()); err != nil {
			return fmt.Errorf("dropping the invalid index %s: %w", n, err)
		}
	}
	return nil
}

// partition is one partition of inbox_messages and its range of id times:
// from is zero for the first (MINVALUE), both are zero for the default.
type tablePartition struct {
	name     string
	from, to time.Time
}

func (p tablePartition) isDefault() bool { return p.to.IsZero() }

// listPartitions reads inbox_messages's partitions from the catalog. The
// bounds are read back from their text, which follows the session's
// DateStyle and TimeZone: both are pinned for the read, so a zone
// abbreviation that reads back as another zone cannot come in.
func listPartitions(ctx context.Context, q pgtable.DB) ([]tablePartition, error) {
	var parts []tablePartition
	err := pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
		for _, set := range []string{`SET LOCAL DateStyle = 'ISO'`, `SET LOCAL TimeZone = 'UTC'`} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, `
			SELECT c.relname::text,
				substring(pg_get_expr(c.relpartbound, c.oid) from 'FROM \(''([^'']+)''\)')::timestamptz,
				substring(pg_get_expr(c.relpartbound, c.oid) from 'TO \(''([^'']+)''\)')::timestamptz
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'inbox_messages'::regclass
			ORDER BY 3 NULLS LAST`)
		if err != nil {
			return err
		}
		parts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (tablePartition, error) {
			var p tablePartition
			var from, to *time.Time
			err := r.Scan(&p.name, &from, &to)
			if from != nil {
				p.from = from.UTC()
			}
			if to != nil {
				p.to = to.UTC()
			}
			return p, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: listing inbox_messages's partitions: %w", err)
	}
	return parts, nil
}

// makePartitions makes the partitions of the current interval and Ahead
// after it that no partition covers yet, and returns their names. Rows the
// default partition holds in a new partition's range move into it.
func makePartitions(ctx context.Context, pool *pgxpool.Pool, p Partitioning, now time.Time) ([]string, error) {
	parts, err := listPartitions(ctx, pool)
	if err != nil {
		return nil, err
	}
	var made []string
	for k := range p.Ahead + 1 {
		start := pgtable.FloorTo(now, p.Interval).Add(time.Duration(k) * p.Interval)
		if covered(parts, start) {
			continue
		}
		name := partitionName(start)
		if err := makePartition(ctx, pool, p, name, start, end(parts, start, start.Add(p.Interval))); err != nil {
			return made, fmt.Errorf("inbox: making partition %s: %w", name, err)
		}
		made = append(made, name)
	}
	return made, nil
}

// end returns to, or the start of the first partition made after from and
// before to: after Interval changed, the new partitions fill the gaps the
// old ones left without overlapping them.
func end(parts []tablePartition, from, to time.Time) time.Time {
	for _, p := range parts {
		if !p.isDefault() && !p.from.IsZero() && p.from.After(from) && p.from.Before(to) {
			to = p.from
		}
	}
	return to
}

func covered(parts []tablePartition, t time.Time) bool {
	for _, p := range parts {
		if !p.isDefault() && !t.Before(p.from) && t.Before(p.to) {
			return true
		}
	}
	return false
}

// makePartition makes a table and attaches it, which, unlike CREATE TABLE
// ... PARTITION OF, does not wait for every transaction writing the inbox.
func makePartition(ctx context.Context, pool *pgxpool.Pool, p Partitioning, name string, from, to time.Time) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		table := pgx.Identifier{name}.Sanitize()
		bounds := fmt.Sprintf("FOR VALUES FROM (%s) TO (%s)", quoteTime(from), quoteTime(to))
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, p.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE `+table+` (LIKE inbox_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
			return err
		}
		// Rows the default partition took in this range (ids ahead of the
		// partitions made) move in, or the attach would fail on them. Its
		// writes wait meanwhile, so none lands there after the look.
		if _, err := tx.Exec(ctx, `LOCK TABLE `+partitionDefault+` IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		var strays bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+partitionDefault+` WHERE msg_time >= $1 AND msg_time < $2)`,
			from, to).Scan(&strays); err != nil {
			return err
		}
		if strays {
			for _, s := range []string{
				`INSERT INTO ` + table + ` SELECT * FROM ` + partitionDefault + ` WHERE msg_time >= $1 AND msg_time < $2`,
				`DELETE FROM ` + partitionDefault + ` WHERE msg_time >= $1 AND msg_time < $2`,
			} {
				if _, err := tx.Exec(ctx, s, from, to); err != nil {
					return fmt.Errorf("%s: %w", pgtable.FirstLine(s), err)
				}
			}
		}
		_, err := tx.Exec(ctx, `ALTER TABLE inbox_messages ATTACH PARTITION `+table+` `+bounds)
		return err
	})
	if err != nil && ctx.Err() == nil {
		// Another process's sweep may have made it meanwhile (the error is
		// then duplicate_table, or a unique violation in the catalog).
		if parts, lerr := listPartitions(ctx, pool); lerr == nil && covered(parts, from) {
			return nil
		}
	}
	return err
}

// dropPartition drops the partition when every consumer with rows in it has
// cleared it and no row in it was written since, and reports whether it
// did. It holds off writes to the partition while it checks (SHARE), and
// waits at most LockTimeout for the table's lock to drop it.
func dropPartition(ctx context.Context, pool *pgxpool.Pool, p Partitioning, name string) (bool, error) {
	table := pgx.Identifier{name}.Sanitize()
	var dropped bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, p.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN SHARE MODE`); err != nil {
			return err
		}
		var ok bool
		err := tx.QueryRow(ctx, `
			WITH RECURSIVE consumers AS ( -- the consumers with rows, one index probe each
				SELECT (SELECT min(consumer) FROM `+table+`) AS c
				UNION ALL
				SELECT (SELECT min(consumer) FROM `+table+` WHERE consumer > consumers.c) FROM consumers WHERE c IS NOT NULL
			), clearances AS (
				SELECT k.c, pc.cleared_at, pc.slack FROM consumers k
				LEFT JOIN inbox_partitions_cleared pc ON pc.partition = $1 AND pc.consumer = k.c
				WHERE k.c IS NOT NULL
			)
			SELECT NOT EXISTS (SELECT 1 FROM clearances WHERE cleared_at IS NULL)
				AND coalesce((SELECT max(processed_at) FROM `+table+`) < (SELECT min(cleared_at) - max(slack) FROM clearances), true)`,
			name).Scan(&ok)
		if err != nil || !ok {
			return err
		}
		if _, err := tx.Exec(ctx, `DROP TABLE `+table); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM inbox_partitions_cleared WHERE partition = $1`, name)
		dropped = err == nil
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "55P03", "40P01": // lock_not_available, deadlock_detected: the next sweep tries again
			return false, nil
		case "42P01": // undefined_table: another process's sweep dropped it
			return false, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("inbox: dropping partition %s: %w", name, err)
	}
	return dropped, nil
}

// checkShape is checkShapeOnce before d's first write: a consumer wired to
// the wrong shape writes no row (its deliveries fail, with the reason, and
// come again) whether or not it runs Run.
func (in *Inbox) checkShape(d *delivery) error {
	if in.shapeOK.Load() {
		return nil
	}
	ctx, cancel := in.txContext(d)
	defer cancel()
	return in.checkShapeOnce(ctx)
}

// checkShapeOnce is checkPartitioned until it has passed once: Run calls
// it, and every delivery (checkShape).
func (in *Inbox) checkShapeOnce(ctx context.Context) error {
	if in.shapeOK.Load() {
		return nil
	}
	if err := in.checkPartitioned(ctx); err != nil {
		return err
	}
	in.shapeOK.Store(true)
	return nil
}

// checkPartitioned reports a table whose shape does not match
// Config.Partitions: writes would fail, or all go to one partition, where
// a copy of their message written by a consumer with Config.Partitions
// would not meet them.
func (in *Inbox) checkPartitioned(ctx context.Context) error {
	partitioned, err := schema.Partitioned(ctx, in.cfg.Pool)
	if err != nil {
		return err
	}
	switch {
	case in.cfg.Partitions != nil && !partitioned:
		return errors.New("inbox: Config.Partitions is set but inbox_messages is not partitioned: run PartitionByIDTime")
	case in.cfg.Partitions == nil && partitioned:
		return errors.New("inbox: inbox_messages is partitioned (PartitionByIDTime) but Config.Partitions is not set: " +
			"rows would be written without their id's time")
	}
	return nil
}

func quoteTime(t time.Time) string { return "'" + t.UTC().Format(time.RFC3339Nano) + "'" }

// timeInID is the stage (stages.go) of a partitioned inbox: an id that
// carries no time to place its row by is refused.
func timeInID(in *Inbox, d *delivery) string {
	if _, err := in.cfg.Partitions.Time(d.id); err != nil {
		return fmt.Sprintf("message id %q carries no time to place its inbox row by (Config.Partitions): %v", d.id, err)
	}
	return ""
}
