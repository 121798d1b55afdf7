package outbox

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The names before the three components shared one admin vocabulary
// (List…, Get…, Retry…, Drop…, Read…Stats). They stay until the next
// major version.

// Parked is ListParked.
//
// Deprecated: use ListParked.
func Parked(ctx context.Context, pool *pgxpool.Pool) ([]ParkedRow, error) {
	return ListParked(ctx, pool)
}

// Retry is RetryParked.
//
// Deprecated: use RetryParked.
func Retry(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	return RetryParked(ctx, pool, id)
}

// Drop is DropParked.
//
// Deprecated: use DropParked.
func Drop(ctx context.Context, pool *pgxpool.Pool, id int64, by, why string) error {
	return DropParked(ctx, pool, id, by, why)
}
