package platform

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// DB is the service's database: its pool, and, with DATABASE_STANDBYS, the
// gate that holds back what leaves a transaction (an answer, an event, an
// offset, a call) until the primary's standbys hold the transaction
// (pkg/standby). The relay, the inbox and the effect runner get the gate
// from Run; a route answers through Write.
type DB struct {
	*pgxpool.Pool
	Standby *standby.Gate // nil: nothing waits (one node, or synchronous replication)
}

// newDB makes the gate DATABASE_STANDBYS asks for.
func newDB(cfg Config, pool *pgxpool.Pool, log *slog.Logger) (DB, error) {
	db := DB{Pool: pool}
	if cfg.DatabaseStandbys == 0 {
		warnIfAsync(pool, log)
		return db, nil
	}
	gate, err := standby.New(standby.Config{Pool: pool, Standbys: cfg.DatabaseStandbys, Slots: cfg.DatabaseStandbySlots, Logger: log})
	if err != nil {
		return DB{}, fmt.Errorf("DATABASE_STANDBYS: %w", err)
	}
	log.Info("database: what leaves a transaction waits until its standbys hold it",
		"standbys", cfg.DatabaseStandbys, "slots", cfg.DatabaseStandbySlots)
	db.Standby = gate
	return db, nil
}

// Write runs fn in a transaction, commits it, and returns once the
// standbys hold it (DATABASE_STANDBYS): an answer given after Write is not
// taken back by a failover. When the standbys did not confirm it (the
// primary changed, or they stopped streaming), the transaction may or may
// not survive, and the error says the database is unavailable (a 503: the
// client asks again, and the write is idempotent).
func (db DB) Write(ctx context.Context, fn func(tx pgx.Tx) error) error {
	var ticket standby.Ticket
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		if err := fn(tx); err != nil {
			return err
		}
		ticket, err = db.Standby.Mark(ctx, tx)
		return err
	})
	if err != nil {
		return err
	}
	if err := db.Standby.Wait(ctx, ticket); err != nil {
		return standbyError{err}
	}
	return nil
}

// standbyError is a wait for the standbys that failed: DatabaseUnavailable.
type standbyError struct{ err error }

func (e standbyError) Error() string {
	return "committed, but the standbys did not confirm it: " + e.err.Error()
}
func (e standbyError) Unwrap() error { return e.err }

// warnIfAsync says, at start, when the database streams to standbys that
// do not confirm commits (no synchronous_standby_names) while nothing waits
// for them: a failover can then lose what the service already let out.
func warnIfAsync(pool *pgxpool.Pool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var streaming int
	var syncNames string
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical' AND active),
		current_setting('synchronous_standby_names')`).Scan(&streaming, &syncNames)
	if err == nil && streaming > 0 && syncNames == "" {
		log.Warn("database: it replicates asynchronously and DATABASE_STANDBYS is 0: a failover can lose events this service published "+
			"and messages it acknowledged (docs/failover.md)", "streaming_standbys", streaming)
	}
}
