package pgtable

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
