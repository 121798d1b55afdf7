package outbox

// A partitioned outbox_messages (RelayConfig.Partitions): the table is
// partitioned by ranges of its id, one range per Interval of time, and
// retention drops a whole partition once every row in it is published and
// past Retention, instead of deleting rows (docs/partitioning.md).
//
// The partitions, by id:
//
//	outbox_messages_before_cut      MINVALUE .. the first block: the table as
//	                                it was before PartitionByTime, rows and
//	                                indexes kept
//	outbox_messages_pYYYYMMDDtHHMM  one block of PartitionIDs ids for the
//	                                Interval from that time, made Ahead in
//	                                advance
//
// The relay moves the id sequence to the block of the current interval when
// that interval starts, forward only, under a lock its replicas share. Ids
// keep growing, so the relay's id order, and with it each key's order, is
// the same as on a plain table, and every statement that finds a row by id
// finds it in one partition. Producers change nothing: a row goes where its
// id falls, and no id can fall outside the partitions (the sequence only
// moves into blocks that are made). A partition whose block the sequence
// has left takes no new row, so once its rows are all published and past
// Retention nothing can bring one back, and it is dropped.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/internal/pgtable"
)

// Partitioning is RelayConfig.Partitions: outbox_messages partitioned into
// one block of ids per Interval (PartitionByTime converts the table), and
// retired by dropping whole partitions.
type Partitioning struct {
	// Interval is the span of time whose rows one partition holds.
	// Partitions start at multiples of it since the Unix epoch (UTC).
	// Defaults to DefaultPartitionInterval.
	Interval time.Duration
	// Ahead is how many partitions past the current one are kept made.
	// Defaults to DefaultPartitionsAhead.
	Ahead int
	// LockTimeout bounds the wait for the table's locks when a partition is
	// made or dropped: producers queue behind that wait, so it is short, and
	// a relay that cannot have the locks tries again at its next retention
	// round. Defaults to DefaultPartitionLockTimeout.
	LockTimeout time.Duration
}

// The defaults of Partitioning's zero fields.
const (
	DefaultPartitionInterval    = 24 * time.Hour
	DefaultPartitionsAhead      = 3
	DefaultPartitionLockTimeout = 500 * time.Millisecond
)

// PartitionIDs is how many ids one partition's block holds: the ids of a
// partitioned outbox are block × PartitionIDs + n, and a block outlasts any
// Interval at any rate a Postgres table takes.
const PartitionIDs = 1_000_000_000_000

func (p *Partitioning) setDefaults() {
	p.Interval = cmp.Or(p.Interval, DefaultPartitionInterval)
	p.Ahead = cmp.Or(p.Ahead, DefaultPartitionsAhead)
	p.LockTimeout = cmp.Or(p.LockTimeout, DefaultPartitionLockTimeout)
}

func (p Partitioning) withDefaults() Partitioning {
	p.setDefaults()
	return p
}

func (p Partitioning) validate() error {
	return pgtable.CheckPartitioning("outbox: Partitioning", p.Interval, p.Ahead, p.LockTimeout)
}

// The first partition, and the prefix of the others' names.
const (
	partitionBeforeCut = "outbox_messages_before_cut"
	partitionPrefix    = "outbox_messages_p"
	partitionTime      = "20060102t1504"
)

// partitionLockSpace serializes the relays' work on the partitions
// (PartitionByTime, and the retention round's making, moving and dropping).
const partitionLockSpace = 7_412_006

// partition is one partition of outbox_messages: its block of ids [lo, hi)
// (lo is noLo for the first, whose range starts at MINVALUE) and the start
// of the interval it holds (zero for the first).
type partition struct {
	name   string
	start  time.Time
	lo, hi int64
}

const noLo = -1 << 63

// PartitionByTime converts outbox_messages into a table partitioned by
// blocks of ids, one per Interval, in place: the table as it is becomes the
// first partition, its rows not copied, and the ids of new rows start at
// the next block. Run Migrate first. A table already partitioned is left as
// it is (the partitions ahead are made, as the relay makes them).
//
// Producers need no change and may write meanwhile. The conversion takes
// the table's lock twice, each for a moment: to add a constraint on the
// first partition's range (checking it, the scan, does not block writes),
// and for the one transaction that swaps the tables.
// Each waits LockTimeout at most, producers queueing behind it, and is
// tried again until it has the lock, for a minute at most. The table's
// grants are carried over. Relays of the table must run with
// RelayConfig.Partitions afterwards: a relay without it retires rows by
// DELETE and moves the ids to no new block (they stay in the block they
// are in, so nothing fails), and says so in its log.
func PartitionByTime(ctx context.Context, pool *pgxpool.Pool, p Partitioning) error {
	p.setDefaults()
	if err := p.validate(); err != nil {
		return err
	}
	return withPartitionLock(ctx, pool, true, func(conn *pgxpool.Conn) error {
		partitioned, err := isPartitioned(ctx, conn)
		if err != nil {
			return err
		}
		if !partitioned {
			if err := convert(ctx, conn, p, time.Now()); err != nil {
				return fmt.Errorf("outbox: partitioning outbox_messages: %w", err)
			}
		}
		parts, err := listPartitions(ctx, conn)
		if err != nil {
			return err
		}
		_, err = makePartitions(ctx, conn, p, parts, time.Now())
		return err
	})
}

// withPartitionLock runs fn on a connection holding the schema's partition
// lock. With wait, it polls the lock until it has it; without, fn is not
// run when another process holds it.
func withPartitionLock(ctx context.Context, pool *pgxpool.Pool, wait bool, fn func(*pgxpool.Conn) error) error {
	err := pgtable.WithSessionLock(ctx, pool, "outbox: the partition lock", `$1::int, hashtext(current_schema())`,
		[]any{partitionLockSpace}, wait, fn)
	if errors.Is(err, pgtable.ErrLockHeld) {
		return nil // another relay's round does the work
	}
	return err
}

func isPartitioned(ctx context.Context, q pgtable.DB) (bool, error) {
	var kind string
	if err := q.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'outbox_messages'::regclass`).Scan(&kind); err != nil {
		return false, fmt.Errorf("outbox: reading outbox_messages's kind (has Migrate run?): %w", err)
	}
	return kind == "p", nil
}

// convert runs PartitionByTime's steps on an unpartitioned table.
func convert(ctx context.Context, conn pgtable.DB, p Partitioning, now time.Time) error {
	lockTimeout := fmt.Sprintf(`SET LOCAL lock_timeout = %d`, p.LockTimeout.Milliseconds())
	// The first block starts past every id given so far: ids given until
	// the lock below are far below it (a block is 10^12 ids).
	next, err := nextID(ctx, conn)
	if err != nil {
		return err
	}
	first := (next/PartitionIDs + 1) * PartitionIDs
	if first-next < PartitionIDs/1000 {
		first += PartitionIDs // too close to the next block to be sure no id reaches it before the lock
	}
	// Attaching checks every row is in the partition's range unless a
	// validated constraint says so. Adding it takes the table's lock for a
	// moment; validating it does not block writes.
	for _, s := range []string{
		fmt.Sprintf(`ALTER TABLE outbox_messages DROP CONSTRAINT IF EXISTS %[1]s, ADD CONSTRAINT %[1]s CHECK (id < %[2]d) NOT VALID`,
			partitionBeforeCut, first),
		`ALTER TABLE outbox_messages VALIDATE CONSTRAINT ` + partitionBeforeCut,
	} {
		err := retryLocked(ctx, func() error {
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, lockTimeout); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, s)
				return err
			})
		})
		if err != nil {
			return fmt.Errorf("%s: %w", pgtable.FirstLine(s), err)
		}
	}
	return retryLocked(ctx, func() error {
		return cutOver(ctx, conn, lockTimeout, first, partitionName(pgtable.FloorTo(now, p.Interval)))
	})
}

// retryLocked runs fn until it does not fail for want of a lock: each try
// waits LockTimeout at most for the table's lock, producers queueing behind
// it meanwhile, so a long transaction holding the table makes the
// conversion wait in short steps rather than stall every writer. It gives
// up after a minute of tries.
func retryLocked(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(time.Minute)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := fn()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// cutOver is the conversion's one transaction under the table's lock.
func cutOver(ctx context.Context, conn pgtable.DB, lockTimeout string, first int64, current string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		cut := []string{
			lockTimeout,
			`LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE`,
			`ALTER TABLE outbox_messages RENAME TO ` + partitionBeforeCut,
			`ALTER TABLE ` + partitionBeforeCut + ` ALTER COLUMN id DROP IDENTITY`,
			`ALTER INDEX outbox_messages_pkey RENAME TO ` + partitionBeforeCut + `_pkey`,
			`ALTER INDEX outbox_messages_pending RENAME TO ` + partitionBeforeCut + `_pending`,
			`ALTER INDEX outbox_messages_published RENAME TO ` + partitionBeforeCut + `_published`,
			`ALTER INDEX outbox_messages_parked RENAME TO ` + partitionBeforeCut + `_parked`,
			`CREATE TABLE outbox_messages (LIKE ` + partitionBeforeCut + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id)`,
			`ALTER TABLE outbox_messages DROP CONSTRAINT ` + partitionBeforeCut,
			fmt.Sprintf(`ALTER TABLE outbox_messages ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %d)`, first),
			`ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_pkey PRIMARY KEY (id)`,
			// The same indexes as migrations 001 and 002: attaching the
			// first partition takes its own as theirs, building nothing.
			`CREATE INDEX outbox_messages_pending ON outbox_messages (id) WHERE published_at IS NULL`,
			`CREATE INDEX outbox_messages_published ON outbox_messages (published_at) WHERE published_at IS NOT NULL`,
			`CREATE INDEX outbox_messages_parked ON outbox_messages (topic, partition_key, id) WHERE parked_at IS NOT NULL`,
			fmt.Sprintf(`ALTER TABLE outbox_messages ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%d)`, partitionBeforeCut, first),
		}
		for _, s := range cut {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", pgtable.FirstLine(s), err)
			}
		}
		if err := pgtable.CopyGrants(ctx, tx, partitionBeforeCut, "outbox_messages"); err != nil {
			return err
		}
		// The block the new ids start in, made in the same transaction: no
		// row is written before it is there.
		return makePartition(ctx, tx, current, first)
	})
}

func partitionName(start time.Time) string {
	return partitionPrefix + start.UTC().Format(partitionTime)
}

// listPartitions reads outbox_messages's partitions from the catalog, in
// id order.
func listPartitions(ctx context.Context, q pgtable.DB) ([]partition, error) {
	rows, err := q.Query(ctx, `
		SELECT c.relname::text,
			substring(pg_get_expr(c.relpartbound, c.oid) from 'FROM \(''(-?[0-9]+)''\)')::bigint,
			substring(pg_get_expr(c.relpartbound, c.oid) from 'TO \(''(-?[0-9]+)''\)')::bigint
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox_messages'::regclass
		ORDER BY 3`)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing outbox_messages's partitions: %w", err)
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
		var p partition
		var lo, hi *int64
		if err := r.Scan(&p.name, &lo, &hi); err != nil {
			return p, err
		}
		if hi == nil {
			return p, fmt.Errorf("partition %s has no upper bound: it is not one the relay made", p.name)
		}
		p.lo, p.hi = noLo, *hi
		if lo != nil {
			p.lo = *lo
		}
		if p.name == partitionBeforeCut {
			return p, nil
		}
		start, ok := strings.CutPrefix(p.name, partitionPrefix)
		t, err := time.Parse(partitionTime, start)
		if !ok || err != nil {
			return p, fmt.Errorf("partition %s is not one the relay made (outbox_messages_pYYYYMMDDtHHMM)", p.name)
		}
		p.start = t
		return p, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: listing outbox_messages's partitions: %w", err)
	}
	return parts, nil
}

// makePartitions makes the partitions of the current interval and Ahead
// after it that start after the last one made, each with the block of ids
// after the last one's, and returns the partitions as they are now.
func makePartitions(ctx context.Context, q pgtable.DB, p Partitioning, parts []partition, now time.Time) ([]partition, error) {
	if len(parts) == 0 {
		return nil, errors.New("outbox: outbox_messages has no partition (not one PartitionByTime made)")
	}
	for k := range p.Ahead + 1 {
		start := pgtable.FloorTo(now, p.Interval).Add(time.Duration(k) * p.Interval)
		last := parts[len(parts)-1]
		if !start.After(last.start) {
			continue
		}
		if last.hi > math.MaxInt64-PartitionIDs {
			return parts, fmt.Errorf("outbox: no block of ids is left after %s's", last.name)
		}
		name := partitionName(start)
		err := pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, p.LockTimeout.Milliseconds())); err != nil {
				return err
			}
			return makePartition(ctx, tx, name, last.hi)
		})
		if err != nil {
			return parts, fmt.Errorf("outbox: making partition %s: %w", name, err)
		}
		parts = append(parts, partition{name: name, start: start, lo: last.hi, hi: last.hi + PartitionIDs})
	}
	return parts, nil
}

// makePartition makes a table and attaches it with the block of ids from
// lo, which, unlike CREATE TABLE ... PARTITION OF, does not wait for every
// transaction writing the outbox.
func makePartition(ctx context.Context, tx pgx.Tx, name string, lo int64) error {
	table := pgx.Identifier{name}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE TABLE `+table+` (LIKE outbox_messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE outbox_messages ATTACH PARTITION %s FOR VALUES FROM (%d) TO (%d)`,
		table, lo, lo+PartitionIDs))
	return err
}

// RetirePartitions is the retention round of a partitioned outbox, which
// the relay runs every RetentionInterval: it makes the partitions ahead,
// moves the ids to the current interval's block, and drops the partitions
// whose every row is published and past Retention and that no new row can
// enter. It returns the names of those it dropped. Another relay's round
// running at the moment does the work instead.
func (r *Relay) RetirePartitions(ctx context.Context) (dropped []string, err error) {
	return r.retirePartitionsAt(ctx, time.Now())
}

func (r *Relay) retirePartitionsAt(ctx context.Context, now time.Time) (dropped []string, err error) {
	if r.cfg.Partitions == nil {
		return nil, errors.New("outbox: RetirePartitions needs RelayConfig.Partitions")
	}
	p := *r.cfg.Partitions
	err = withPartitionLock(ctx, r.cfg.Pool, false, func(conn *pgxpool.Conn) error {
		parts, err := listPartitions(ctx, conn)
		if err != nil {
			return err
		}
		// A partition that cannot be made now (its lock not had) stops
		// neither the move nor the drops: they need only those made.
		parts, makeErr := makePartitions(ctx, conn, p, parts, now)
		if len(parts) == 0 {
			return makeErr
		}
		next, err := moveIDs(ctx, conn, parts, now)
		if err != nil {
			return errors.Join(makeErr, err)
		}
		for _, part := range parts {
			if part.hi > next {
				break // the ids are still in its block, or have yet to come to it
			}
			ok, err := r.dropPartition(ctx, conn, part.name)
			if err != nil {
				return errors.Join(makeErr, err)
			}
			if ok {
				dropped = append(dropped, part.name)
			}
		}
		return makeErr
	})
	return dropped, err
}

// moveIDs moves the id sequence forward to the block of the partition of
// now's interval, if it is still before it, and returns the next id it
// gives.
func moveIDs(ctx context.Context, conn pgtable.DB, parts []partition, now time.Time) (int64, error) {
	current := parts[0]
	for _, p := range parts {
		if !p.start.After(now) {
			current = p
		}
	}
	next, err := nextID(ctx, conn)
	if err != nil || next >= current.lo {
		return next, err
	}
	if _, err := conn.Exec(ctx, `SELECT setval(pg_get_serial_sequence('outbox_messages', 'id'), $1, false)`, current.lo); err != nil {
		return 0, fmt.Errorf("outbox: moving the ids to partition %s: %w", current.name, err)
	}
	return current.lo, nil
}

// nextID returns the next id outbox_messages's sequence gives (or more,
// after rows written with ids of their own).
func nextID(ctx context.Context, conn pgtable.DB) (int64, error) {
	var seq string
	if err := conn.QueryRow(ctx, `SELECT pg_get_serial_sequence('outbox_messages', 'id')`).Scan(&seq); err != nil {
		return 0, fmt.Errorf("outbox: finding outbox_messages's id sequence: %w", err)
	}
	var next int64
	// seq is the catalog's own quoted name.
	err := conn.QueryRow(ctx, `SELECT greatest(last_value + is_called::int, (SELECT coalesce(max(id), 0) + 1 FROM outbox_messages)) FROM `+seq).Scan(&next)
	if err != nil {
		return 0, fmt.Errorf("outbox: reading the id sequence: %w", err)
	}
	return next, nil
}

// dropPartition drops the partition when every row in it is published and
// past Retention, and reports whether it did. It looks first without a
// lock; then it takes the table's lock (waiting at most LockTimeout), under
// which no row can be written or unpublished, and looks again before it
// drops.
func (r *Relay) dropPartition(ctx context.Context, conn pgtable.DB, name string) (bool, error) {
	table := pgx.Identifier{name}.Sanitize()
	retired := `SELECT NOT EXISTS (SELECT 1 FROM ` + table + ` WHERE published_at IS NULL)
		AND coalesce((SELECT max(published_at) FROM ` + table + `) < now() - $1::interval, true)`
	var ok bool
	if err := conn.QueryRow(ctx, retired, r.cfg.Retention).Scan(&ok); err != nil {
		return false, fmt.Errorf("outbox: reading partition %s: %w", name, err)
	}
	if !ok {
		return false, nil
	}
	var dropped bool
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, r.cfg.Partitions.LockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE ONLY outbox_messages IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, retired, r.cfg.Retention).Scan(&ok); err != nil || !ok {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TABLE `+table)
		dropped = err == nil
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01") {
		return false, nil // lock_not_available, deadlock_detected: the next round tries again
	}
	if err != nil {
		return false, fmt.Errorf("outbox: dropping partition %s: %w", name, err)
	}
	return dropped, nil
}

// checkPartitioned refuses a relay with Partitions on an unpartitioned
// table (it could neither make nor drop partitions), and reports the other
// mismatch, which works, to the log. err is Postgres not answering.
func (r *Relay) checkPartitioned(ctx context.Context) (refused, err error) {
	partitioned, err := isPartitioned(ctx, r.cfg.Pool)
	if err != nil {
		return nil, err
	}
	switch {
	case r.cfg.Partitions != nil && !partitioned:
		return errors.New("outbox: RelayConfig.Partitions is set but outbox_messages is not partitioned: run PartitionByTime"), nil
	case r.cfg.Partitions == nil && partitioned:
		r.cfg.log.Error("Outbox table is partitioned but RelayConfig.Partitions is not set: "+
			"rows are retired by DELETE and no partition is made or dropped", nil, nil)
	}
	return nil, nil
}
