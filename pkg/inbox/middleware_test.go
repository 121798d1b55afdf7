package inbox_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestMiddleware: a delivery is applied once, however often it comes, and a
// handler that fails is retried, then dead-lettered.
func TestMiddleware(t *testing.T) {
	t.Parallel()

	t.Run("ConcurrentDeliveriesApplyOnce", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		b.handler.hook = holdUntilContended(t, b, 9)
		id := newID()

		deliverConcurrently(t, b.ctx, in.Middleware(b.handler.handle), id, []byte(`{"amount":100}`), 10)

		require.Equal(t, 1, b.handler.callsFor(id), "handler runs")
		require.Equal(t, 1, appliedRows(t, b, consumer, id), "domain rows")
		stats := in.Stats()
		require.Equal(t, int64(1), stats.Applied)
		require.Equal(t, int64(9), stats.Duplicates)
		require.Equal(t, 9, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, id))
	})

	t.Run("RedeliveryAfterCommitIsDuplicate", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		id, payload := newID(), []byte(`{"amount":100}`)

		require.NoError(t, deliver(b.ctx, mw, id, payload))
		// The process died after the commit, before the offset was committed:
		// the broker delivers the message again.
		require.NoError(t, deliver(b.ctx, mw, id, payload))

		require.Equal(t, 1, b.handler.callsFor(id), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
		require.Equal(t, 1, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, id))
	})

	t.Run("HandlerErrorRollsBackThenDeadLetters", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 3, RetryBackoff: time.Millisecond})
		boom := errors.New("ledger unavailable")
		b.handler.hook = func(*message.Message, int) error { return boom } // after its domain write
		id, payload := newID(), []byte(`{"amount":100}`)

		// The database as the first failed attempt left it.
		type state struct{ applied, inboxRows, attempts int }
		var afterFirst *state
		b.events.then = func(e inbox.Event) {
			if e.Outcome == inbox.Retried && e.Attempt == 1 {
				afterFirst = &state{
					applied:   appliedRows(t, b, consumer, id),
					inboxRows: scalar[int](t, b, `SELECT count(*) FROM inbox_messages`),
					attempts:  scalar[int](t, b, `SELECT attempts FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, consumer, id),
				}
			}
		}

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, payload), "a dead letter is acknowledged")

		require.NotNil(t, afterFirst, "no Retried event for attempt 1")
		require.Equal(t, state{applied: 0, inboxRows: 0, attempts: 1}, *afterFirst, "after the first attempt")

		require.Equal(t, 3, b.handler.callsFor(id), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, 0, appliedRows(t, b, consumer, id), "every attempt rolled back")
		require.Equal(t, "dead_lettered", scalar[string](t, b, `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, id))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_attempts`), "attempt counter cleared")

		var kind, reason string
		var attempts int
		var stored []byte
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, reason, attempts, payload FROM inbox_quarantine
			WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&kind, &reason, &attempts, &stored))
		require.Equal(t, "dead_letter", kind)
		require.Contains(t, reason, boom.Error())
		require.Equal(t, 3, attempts)
		require.Equal(t, payload, stored)

		var topic, dlqReason, dlqID string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT topic, metadata->>'dead_letter_reason', metadata->>'dead_letter_message_id', payload
			FROM outbox_messages`).Scan(&topic, &dlqReason, &dlqID, &stored))
		require.Equal(t, consumer+".dlq", topic)
		require.Contains(t, dlqReason, boom.Error())
		require.Equal(t, id, dlqID)
		require.Equal(t, payload, stored)

		// A redelivery of the dead letter does not run the handler again.
		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, payload))
		require.Equal(t, 3, b.handler.callsFor(id))
		require.Equal(t, inbox.Duplicate, b.events.last(t).Outcome)
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages`), "one dead letter published")
	})

	t.Run("RetrySucceedsAfterFailures", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 3, RetryBackoff: time.Millisecond})
		b.handler.hook = func(_ *message.Message, call int) error {
			if call <= 2 {
				return errors.New("deadlock detected")
			}
			return nil
		}
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, 3, b.handler.callsFor(id))
		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Retried, inbox.Applied}, b.events.outcomes(id))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
		require.Equal(t, 3, scalar[int](t, b, `SELECT n FROM applied WHERE message_id = $1`, id), "only the third run committed")
		require.Equal(t, "processed", scalar[string](t, b, `SELECT status FROM inbox_messages WHERE message_id = $1`, id))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_attempts`), "attempt counter removed")
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`))
		require.Equal(t, int64(2), in.Stats().Retries)
	})

	t.Run("PermanentErrorDeadLettersAtOnce", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 5, RetryBackoff: time.Millisecond})
		b.handler.hook = func(*message.Message, int) error {
			// Wrapped further by the handler: IsPermanent must see through it.
			return fmt.Errorf("decoding order: %w", inbox.Permanent(errors.New("unknown schema version 9")))
		}
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{"v":9}`)))

		require.Equal(t, 1, b.handler.callsFor(id), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
		require.Equal(t, "dead_lettered", scalar[string](t, b, `SELECT status FROM inbox_messages WHERE message_id = $1`, id))
		var reason string
		var attempts int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT reason, attempts FROM inbox_quarantine WHERE kind = 'dead_letter' AND message_id = $1`, id).
			Scan(&reason, &attempts))
		require.Contains(t, reason, "unknown schema version 9")
		require.Equal(t, 1, attempts)
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_attempts`), "a permanent error is not counted as a retry")
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, consumer+".dlq"))
	})

	// A payload the inbox accepts (up to MaxPayloadBytes) plus the dead
	// letter's headers can pass the producer's limit: a row no broker takes.
	// The dead letter leaves the payload out and says where it is kept.
	t.Run("LargePayloadDeadLetterFitsTheProducer", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 1, RetryBackoff: time.Millisecond})
		b.handler.hook = func(*message.Message, int) error { return inbox.Permanent(errors.New("no room")) }
		id := newID()
		payload := bytes.Repeat([]byte("z"), 1<<20) // exactly MaxPayloadBytes

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, payload))

		require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, sha(payload), scalar[[]byte](t, b, `SELECT sha256(payload) FROM inbox_quarantine WHERE message_id = $1`, id),
			"inbox_quarantine keeps the whole payload")
		var dlqPayload []byte
		var meta message.Metadata
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload, metadata FROM outbox_messages WHERE topic = $1`, consumer+".dlq").
			Scan(&dlqPayload, &meta))
		dead := message.NewMessage(newID(), dlqPayload)
		dead.Metadata = meta
		require.LessOrEqual(t, outbox.RecordBytes(dead), outbox.DefaultMaxMessageBytes)
		require.Empty(t, dlqPayload)
		require.Contains(t, meta.Get("dead_letter_payload_omitted"), "1048576 bytes")
		require.Equal(t, id, meta.Get("dead_letter_message_id"))
	})

	t.Run("ReturnedMessagesDeadLetter", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 5, RetryBackoff: time.Millisecond})
		id := newID()
		returning := func(msg *message.Message) ([]*message.Message, error) {
			if _, err := b.handler.handle(msg); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(newID(), []byte("{}"))}, nil
		}

		require.NoError(t, deliver(b.ctx, in.Middleware(returning), id, []byte(`{}`)))

		require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, 0, appliedRows(t, b, consumer, id), "the handler's writes were rolled back")
		require.Contains(t, scalar[string](t, b, `SELECT reason FROM inbox_quarantine WHERE message_id = $1`, id), "outbox.PublishTx")
	})

	t.Run("RepeatedDatabaseFailureCountsAsAttempt", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxRetryBackoff: time.Millisecond})
		// A deadlock every time, for this one message: transient, so not
		// counted at first, but it must not block the partition forever.
		b.handler.hook = func(*message.Message, int) error { return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"} }
		id := newID()

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{}`)))

		require.Equal(t, inbox.DeadLettered, b.events.outcomes(id)[len(b.events.outcomes(id))-1])
		require.Equal(t, 20, b.handler.callsFor(id), "10 database failures absorbed per counted attempt, 2 attempts")
	})

}
