package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MakePartitionsAt makes the partitions Sweep would make at now: tests make
// past days' partitions with it, to see them retired.
func MakePartitionsAt(ctx context.Context, pool *pgxpool.Pool, p Partitioning, now time.Time) ([]string, error) {
	p.setDefaults()
	return makePartitions(ctx, pool, p, now)
}
