package inbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestMiddlewareFailedAttempts: a panic, a refused commit or a swallowed
// statement error counts as a failed attempt; a database failure under the
// handler does not.
func TestMiddlewareFailedAttempts(t *testing.T) {
	t.Parallel()

	t.Run("PanicIsFailedAttempt", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 3, RetryBackoff: time.Millisecond})
		b.handler.hook = func(_ *message.Message, call int) error {
			if call == 1 {
				panic("ledger corrupted") // after the domain write
			}
			return nil
		}
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Applied}, b.events.outcomes(id))
		require.Equal(t, 2, b.handler.callsFor(id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id), "the panicking run was rolled back")
		require.Equal(t, 2, scalar[int](t, b, `SELECT n FROM applied WHERE message_id = $1`, id))
	})

	t.Run("PanicEveryTimeDeadLetters", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
		b.handler.hook = func(*message.Message, int) error { panic("ledger corrupted") }
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Contains(t, b.events.last(t).Reason, "handler panicked: ledger corrupted")
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
	})

	// A transaction the server refuses at COMMIT failed because of what the
	// handler wrote: it is a failed attempt, retried and then dead-lettered,
	// not a database outage to hand back to the broker forever.
	t.Run("CommitRefusedIsFailedAttempt", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
		_, err := b.pool.Exec(b.ctx, `CREATE TABLE parent (id int PRIMARY KEY);
			CREATE TABLE child (parent_id int NOT NULL REFERENCES parent DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		b.handler.hook = func(msg *message.Message, _ int) error {
			_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `INSERT INTO child VALUES (42)`) // checked at COMMIT
			return err
		}
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Contains(t, b.events.last(t).Reason, "23503")
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM child`))
	})

	t.Run("SwallowedStatementErrorIsFailedAttempt", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
		b.handler.hook = func(msg *message.Message, _ int) error {
			_, _ = inbox.Tx(msg.Context()).Exec(msg.Context(), `SELECT 1/0`) // error ignored: COMMIT becomes ROLLBACK
			return nil
		}
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
	})

	// A database failure under the handler is not the message's fault: it is
	// retried without counting an attempt, and applied once the database
	// answers again.
	t.Run("DatabaseFailureUnderHandlerIsNotAnAttempt", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 1, RetryBackoff: time.Millisecond})
		failures := map[string]string{
			"serialization failure": `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$`,
			"connection lost":       `SELECT pg_terminate_backend(pg_backend_pid())`,
		}
		for name, sql := range failures {
			b.handler.hook = func(msg *message.Message, call int) error {
				if call > 3 {
					return nil // the database is back
				}
				_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), sql)
				return err
			}
			id := newID()

			require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)), name)

			require.Equal(t, 4, b.handler.callsFor(id), name)
			require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(id), name)
			require.Equal(t, 1, appliedRows(t, b, consumer, id), name)
			require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_attempts`), name)
			require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`), name)
		}
	})

}
