// Package schema holds what the inbox's runtime (package inbox) and its
// operator's tools (package inboxadmin) both say of the inbox's tables.
package schema

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The states of a hold (inbox_held_keys.state, migration 004).
const (
	HoldHeld     = "held"     // the holder is dead-lettered
	HoldRedriven = "redriven" // the holder was written back; it alone goes through
	HoldReleased = "released" // the holder was applied: the parked messages follow
)

// PlanEachTime, passed before a statement's arguments, has Postgres plan the
// statement for the table as it is at that call (pgx's unnamed statement,
// the same single round trip). The statements that find rows of the inbox
// by key or walk it take it. A prepared statement may settle on one
// generic plan from its sixth run, and one made while the table held a few
// rows, as it does in a new deployment's first minute (autovacuum's first
// ANALYZE comes at 50 rows), is a full scan, kept as the table grows until
// the next ANALYZE: every duplicate of a redelivery storm would read the
// whole inbox (TestStatementsStayCheapAsTheInboxGrows). The insert of new
// rows into a plain inbox does not need it: its conflicts are found
// through the primary key whatever the plan. A partitioned inbox's insert
// also looks each id up in the first partition, and takes it.
const PlanEachTime = pgx.QueryExecModeExec

// Text returns s as a Postgres text or jsonb value can hold it: invalid
// UTF-8 and NUL bytes become U+FFFD. Message ids, metadata and handler errors
// come from producers and handlers; a value the database refuses would fail
// the delivery on every redelivery and block the partition.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Partitioned reports whether inbox_messages is partitioned
// (inbox.PartitionByIDTime converted it).
func Partitioned(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (bool, error) {
	var kind string
	if err := db.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'inbox_messages'::regclass`).Scan(&kind); err != nil {
		return false, fmt.Errorf("inbox: reading inbox_messages's kind (has Migrate run?): %w", err)
	}
	return kind == "p", nil
}
