package outbox

import (
	"context"
	"time"
)

// RetirePartitionsAt runs the retention round of a partitioned outbox as if
// it were now: tests move through intervals with it, to see partitions made,
// the ids moved and partitions dropped.
func (r *Relay) RetirePartitionsAt(ctx context.Context, now time.Time) ([]string, error) {
	return r.retirePartitionsAt(ctx, now)
}
