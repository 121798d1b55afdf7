package inbox

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The names before the three components shared one admin vocabulary
// (List…, Get…, Retry…, Drop…, Read…Stats). They stay until the next
// major version.

// ListQuarantine is ListQuarantined.
//
// Deprecated: use ListQuarantined.
func ListQuarantine(ctx context.Context, pool *pgxpool.Pool, f QuarantineFilter) ([]Quarantined, error) {
	return ListQuarantined(ctx, pool, f)
}

// Redrive is RetryQuarantined.
//
// Deprecated: use RetryQuarantined.
func Redrive(ctx context.Context, pool *pgxpool.Pool, id int64, by string) (RedriveResult, error) {
	return RetryQuarantined(ctx, pool, id, by)
}

// Discard is DropQuarantined.
//
// Deprecated: use DropQuarantined.
func Discard(ctx context.Context, pool *pgxpool.Pool, id int64, by, why string) (Quarantined, error) {
	return DropQuarantined(ctx, pool, id, by, why)
}

// Held is ListHeld.
//
// Deprecated: use ListHeld.
func Held(ctx context.Context, pool *pgxpool.Pool, consumer string) ([]HeldKey, error) {
	return ListHeld(ctx, pool, consumer)
}

// HoldStats is ReadHoldStats.
//
// Deprecated: use ReadHoldStats.
func HoldStats(ctx context.Context, pool *pgxpool.Pool, consumer string) (HoldCounts, error) {
	return ReadHoldStats(ctx, pool, consumer)
}
