package pgtable

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outboxref/outbox-inbox/pkg/internal/check"
)

// DB is what the conversions and the partitions' upkeep run their
// statements on: a pool, or one of its connections.
type DB interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
	QueryRow(context.Context, string, ...any) pgx.Row
	Begin(context.Context) (pgx.Tx, error)
}

// FloorTo returns the start of the interval t falls in: intervals start at
// multiples of interval since the Unix epoch (UTC), to the millisecond.
func FloorTo(t time.Time, interval time.Duration) time.Time {
	ms := t.UnixMilli()
	iv := interval.Milliseconds()
	start := ms - ms%iv
	if ms < 0 && ms%iv != 0 {
		start -= iv
	}
	return time.UnixMilli(start).UTC()
}

// FirstLine is a statement's first line, to name it in an error.
func FirstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// CheckPartitioning checks the fields the inbox's and the outbox's
// Partitioning share, their defaults filled in; name is the caller's
// ("inbox: Partitioning").
func CheckPartitioning(name string, interval time.Duration, ahead int, lockTimeout time.Duration) error {
	f := check.Config(name)
	f.That(interval >= time.Minute && interval%time.Minute == 0, "Interval %s is not a whole number of minutes", interval)
	f.That(ahead >= 1, "Ahead must be at least 1 (0: the default)")
	// Postgres takes lock_timeout in milliseconds, and 0 as no timeout.
	f.That(lockTimeout >= time.Millisecond, "LockTimeout must be at least 1ms (0: the default)")
	return f.Err()
}

// DeleteByTime runs query, a DELETE of at most batch rows taken in the
// order of a time column from its last parameter on, which returns
// count(*) and max(time) of the rows it deleted; each run starts where the
// last one ended, until one deletes fewer than batch. It returns how many
// rows it deleted in all, also when a run fails. args are query's other
// parameters, the time is added after them, and the statement is planned
// at each run (pgx's unnamed statement: a plan made for an empty table
// is a full scan).
//
// Starting where the last run ended, not at the oldest row, is what makes
// a backlog cheap: the rows a run deleted stay in the index until vacuum,
// and while any snapshot older than the delete is open (a long
// transaction anywhere in the database) every scan from the start visits
// each of them in the heap again, so a backlog of n expired rows would
// cost n²/2/batch visits (the inbox's BenchmarkSweepBacklog, the outbox's
// BenchmarkDeletePublishedBacklog).
func DeleteByTime(ctx context.Context, db DB, query string, batch int, args ...any) (int64, error) {
	var total int64
	from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		var n int64
		var last pgtype.Timestamptz
		params := append(append([]any{pgx.QueryExecModeExec}, args...), from)
		if err := db.QueryRow(ctx, query, params...).Scan(&n, &last); err != nil {
			return total, err
		}
		total += n
		if n < int64(batch) {
			return total, nil
		}
		from = last
	}
}
