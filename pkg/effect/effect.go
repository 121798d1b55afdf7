package effect

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations holds the effects table's SQL files, for programs that apply
// migrations with their own tool. Migrate applies them.
var Migrations = func() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}()

// Migrate creates or updates the effects table.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate.Apply(ctx, pool, "effect", Migrations)
}

// Effect is one call to the outside world, as a Runner hands it to Do and
// Record.
type Effect struct {
	ID   int64
	Kind string
	// Key is the effect's idempotency key: Do sends it with every attempt,
	// so the outside system performs the effect once however often it is
	// called. It is unique per Kind.
	Key     string
	Payload []byte
	// Attempt counts the calls started, this one included: 1 on the first.
	Attempt int
	Created time.Time
}

// EnqueueTx records the intent to perform an effect, in tx: it is performed
// if and only if tx commits. key is the idempotency key, derived from what
// asks for the effect (an order id, a message id), never drawn at random: a
// second EnqueueTx with the same kind and key records nothing and returns
// false, so a handler that runs twice asks once.
func EnqueueTx(ctx context.Context, tx pgx.Tx, kind, key string, payload []byte) (bool, error) {
	if kind == "" || key == "" {
		return false, errors.New("effect: EnqueueTx needs a kind and a key")
	}
	tag, err := tx.Exec(ctx, `INSERT INTO effects (kind, key, payload) VALUES ($1, $2, $3)
		ON CONFLICT (kind, key) DO NOTHING`, kind, key, payload)
	if err != nil {
		return false, fmt.Errorf("effect: recording %s %s: %w", kind, key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Intent is one effect asked for by EnqueueBatchTx: its idempotency key
// and what Do needs to perform it.
type Intent struct {
	Key     string
	Payload []byte
}

// EnqueueBatchTx is EnqueueTx for several effects of one kind, in one
// statement: a handler that applies a batch of messages asks for their
// effects with one round trip instead of one each. It returns how many
// were recorded; a key already recorded (or repeated in intents) records
// nothing again.
func EnqueueBatchTx(ctx context.Context, tx pgx.Tx, kind string, intents []Intent) (int, error) {
	if kind == "" {
		return 0, errors.New("effect: EnqueueBatchTx needs a kind")
	}
	if len(intents) == 0 {
		return 0, nil
	}
	keys := make([]string, len(intents))
	payloads := make([][]byte, len(intents))
	for i, in := range intents {
		if in.Key == "" {
			return 0, fmt.Errorf("effect: EnqueueBatchTx: intent %d of %s has no key", i, kind)
		}
		keys[i], payloads[i] = in.Key, in.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{} // payload is NOT NULL, as EnqueueTx's
		}
	}
	// In the order given, so ids follow it. (The claim takes effects due at
	// the same moment in the index's order, where their rows landed in the
	// heap: usually this order, not promised.)
	tag, err := tx.Exec(ctx, `INSERT INTO effects (kind, key, payload)
		SELECT $1, u.key, u.payload FROM unnest($2::text[], $3::bytea[]) WITH ORDINALITY AS u(key, payload, n)
		ORDER BY u.n
		ON CONFLICT (kind, key) DO NOTHING`, kind, keys, payloads)
	if err != nil {
		return 0, fmt.Errorf("effect: recording %d effects of %s: %w", len(intents), kind, err)
	}
	return int(tag.RowsAffected()), nil
}

// Permanent wraps err, returned by Do, to say that no retry can succeed (the
// request is invalid, the key was used for another request): the Runner
// stops calling and hands err to Record, which records the failure where a
// person can see it. Do's other errors are retried with backoff.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was wrapped by Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Stats counts one kind's effects by state.
type Stats struct {
	Pending int `json:"pending"`
	Done    int `json:"done"`
	Failed  int `json:"failed"`
	// Retrying counts the pending effects whose last call failed.
	Retrying int `json:"retrying"`
	// OldestPending is the age of the oldest pending effect (0 when none).
	OldestPending time.Duration `json:"oldest_pending"`
}

// ReadStats counts kind's effects.
func ReadStats(ctx context.Context, pool *pgxpool.Pool, kind string) (Stats, error) {
	var s Stats
	var oldest float64
	err := pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE state = 'pending'),
		       count(*) FILTER (WHERE state = 'done'),
		       count(*) FILTER (WHERE state = 'failed'),
		       count(*) FILTER (WHERE state = 'pending' AND last_error IS NOT NULL),
		       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending')), 0)
		FROM effects WHERE kind = $1`, kind).Scan(&s.Pending, &s.Done, &s.Failed, &s.Retrying, &oldest)
	if err != nil {
		return Stats{}, fmt.Errorf("effect: reading stats: %w", err)
	}
	s.OldestPending = time.Duration(oldest * float64(time.Second))
	return s, nil
}
