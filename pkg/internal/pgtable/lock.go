package pgtable

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrLockHeld is returned by WithSessionLock, without wait, when another
// session holds the lock.
var ErrLockHeld = errors.New("another session holds the lock")

// WithSessionLock runs fn on a connection of pool that holds the
// session-level advisory lock key names (the arguments of
// pg_try_advisory_lock, as SQL, with args for its parameters), and
// releases it after. fn's error comes back as it is; one in taking the
// lock begins with what. The lock is polled, never waited for inside a
// statement: such a wait holds a snapshot, which the holder's CREATE INDEX
// CONCURRENTLY would wait for in turn (a deadlock). With wait it polls
// every 100 ms until it has the lock or ctx ends; without, it returns
// ErrLockHeld at once.
func WithSessionLock(ctx context.Context, pool *pgxpool.Pool, what, key string, args []any, wait bool, fn func(*pgxpool.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer conn.Release()
	for {
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+key+`)`, args...).Scan(&got); err != nil {
			return fmt.Errorf("%s: taking the lock: %w", what, err)
		}
		if got {
			break
		}
		if !wait {
			return ErrLockHeld
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: waiting for another process, which holds the lock: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond): // polling a lock another session holds
		}
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(`+key+`)`, args...) //nolint:errcheck // a lost connection unlocks too
	return fn(conn)
}
