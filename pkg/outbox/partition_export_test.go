package outbox

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RetirePartitionsAt runs the retention round of a partitioned outbox as if
// it were now: tests move through intervals with it, to see partitions made,
// the ids moved and partitions dropped.
func (r *Relay) RetirePartitionsAt(ctx context.Context, now time.Time) ([]string, error) {
	return r.retirePartitionsAt(ctx, now)
}

// ExplainClaim returns the plan, as run, of the relay's claim of up to n
// rows, in a transaction it rolls back: nothing is claimed.
func ExplainClaim(ctx context.Context, pool *pgxpool.Pool, n int) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	// Bitmap scans off, as in the relay's transaction (txOptions).
	if _, err := tx.Exec(ctx, `SET LOCAL enable_bitmapscan = off`); err != nil {
		return "", err
	}
	rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) `+claimSQL, n, relayLockSpace)
	if err != nil {
		return "", err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), err
}
