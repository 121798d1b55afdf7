package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the readers below need: a pool, a connection or a
// transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Status is where one check stands.
type Status struct {
	Check    string
	Mark     Mark  // the last entity examined (zero: none yet)
	Examined int64 // entities examined since the check began
	// CaughtUpAt is when a scan last found the check up to its grace
	// period (zero: never). A check far behind (its first rounds over a
	// large table, or a database it cannot read) shows here.
	CaughtUpAt time.Time
	Open       map[string]int // open findings per kind
}

// ReadStatus returns every check's status, by name.
func ReadStatus(ctx context.Context, q Querier) ([]Status, error) {
	rows, err := q.Query(ctx, `SELECT w.check_name, w.mark_time, w.mark_key, w.examined, w.caught_up_at,
			coalesce((SELECT jsonb_object_agg(kind, n) FROM (SELECT kind, count(*) AS n FROM audit_findings f
				WHERE f.check_name = w.check_name AND f.resolved_at IS NULL GROUP BY kind) k), '{}')
		FROM audit_watermarks w ORDER BY w.check_name`)
	if err != nil {
		return nil, fmt.Errorf("reading audit status: %w", err)
	}
	var out []Status
	var s Status
	var mark, caught *time.Time
	_, err = pgx.ForEachRow(rows, []any{&s.Check, &mark, &s.Mark.Key, &s.Examined, &caught, &s.Open}, func() error {
		s.Mark.Time, s.CaughtUpAt = deref(mark), deref(caught)
		out = append(out, s)
		s = Status{}
		return nil
	})
	return out, err
}

// Record is a finding as audit_findings holds it.
type Record struct {
	Check string
	Finding
	FirstSeen, LastSeen time.Time
	ResolvedAt          time.Time // zero: open
	Raised              int       // times opened
	// Repair is what the check's Repair did about it ("": nothing yet),
	// and when; RepairError why its last attempt failed.
	Repair      string
	RepairedAt  time.Time
	RepairError string
}

// Open reports whether the finding still holds.
func (r Record) Open() bool { return r.ResolvedAt.IsZero() }

// ListOptions filters ListFindings.
type ListOptions struct {
	Check string // "": every check
	All   bool   // resolved findings too; by default only the open ones
	Limit int    // defaults to 100
}

// ListFindings returns findings, the most recently seen first.
func ListFindings(ctx context.Context, q Querier, o ListOptions) ([]Record, error) {
	if o.Limit <= 0 {
		o.Limit = 100
	}
	rows, err := q.Query(ctx, `SELECT check_name, entity, kind, detail, first_seen, last_seen, resolved_at, raised,
			coalesce(repair, ''), repaired_at, coalesce(repair_error, '')
		FROM audit_findings WHERE ($1 = '' OR check_name = $1) AND ($2 OR resolved_at IS NULL)
		ORDER BY last_seen DESC, check_name, entity, kind LIMIT $3`, o.Check, o.All, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("listing audit findings: %w", err)
	}
	var out []Record
	var r Record
	var resolved, repaired *time.Time
	_, err = pgx.ForEachRow(rows, []any{&r.Check, &r.Entity, &r.Kind, &r.Detail, &r.FirstSeen, &r.LastSeen, &resolved, &r.Raised,
		&r.Repair, &repaired, &r.RepairError}, func() error {
		r.ResolvedAt, r.RepairedAt = deref(resolved), deref(repaired)
		out = append(out, r)
		return nil
	})
	return out, err
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
