package inbox_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// consumer is the inbox consumer name tests use unless they need two.
const consumer = "billing"

// testBundle is what a test needs besides the Inbox under test.
type testBundle struct {
	ctx     context.Context
	pool    *pgxpool.Pool // a fresh database of the test's own
	handler *applier      // the handler under the middleware
	events  *recorder     // every OnOutcome event, in order
}

// setup returns an Inbox for consumer (or cfg.Consumer) on a fresh database,
// with cfg's Pool and OnOutcome filled in.
func setup(t *testing.T, cfg inbox.Config) (*inbox.Inbox, *testBundle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	b := &testBundle{ctx: ctx, pool: newTestDB(t, ctx), events: &recorder{}}
	in := b.newInbox(t, cfg)
	b.handler = &applier{consumer: in.Consumer()}
	return in, b
}

// newInbox returns another Inbox on the bundle's database, through cfg.Pool
// when the test brings a pool of its own.
func (b *testBundle) newInbox(t *testing.T, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	if cfg.Pool == nil {
		cfg.Pool = b.pool
	}
	if cfg.Consumer == "" {
		cfg.Consumer = consumer
	}
	cfg.OnOutcome = b.events.record
	in, err := inbox.New(cfg)
	require.NoError(t, err)
	if cfg.BatchSize > 1 {
		runInbox(t, in) // batches run only while Run runs
	}
	return in
}

// runInbox runs in.Run until the test ends, and checks that it returned nil
// once its context ended.
func runInbox(t *testing.T, in *inbox.Inbox) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	require.Eventually(t, in.Running, 10*time.Second, time.Millisecond, "Run did not start")
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// scalar runs a one-value query.
func scalar[T any](t *testing.T, b *testBundle, sql string, args ...any) T {
	t.Helper()
	var v T
	require.NoError(t, b.pool.QueryRow(b.ctx, sql, args...).Scan(&v), sql)
	return v
}

// appliedRows counts the domain rows the handler committed for id.
func appliedRows(t *testing.T, b *testBundle, consumer, id string) int {
	t.Helper()
	return scalar[int](t, b, `SELECT count(*) FROM applied WHERE consumer = $1 AND message_id = $2`, consumer, id)
}

// applier is the test handler. Each run inserts one row into applied through
// the inbox transaction, then calls hook (when set), whose error it returns.
type applier struct {
	consumer string
	hook     func(msg *message.Message, call int) error

	mu    sync.Mutex
	calls map[string]int // runs per message id
}

func (a *applier) handle(msg *message.Message) ([]*message.Message, error) {
	a.mu.Lock()
	if a.calls == nil {
		a.calls = map[string]int{}
	}
	a.calls[msg.UUID]++
	call := a.calls[msg.UUID]
	a.mu.Unlock()

	ctx := msg.Context()
	if _, err := inbox.Tx(ctx).Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, $3)`,
		a.consumer, msg.UUID, call); err != nil {
		return nil, err
	}
	if a.hook != nil {
		return nil, a.hook(msg, call)
	}
	return nil, nil
}

func (a *applier) callsFor(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[id]
}

// recorder collects OnOutcome events; then, when set, sees each one as it
// arrives.
type recorder struct {
	mu     sync.Mutex
	events []inbox.Event
	then   func(inbox.Event)
}

func (r *recorder) record(e inbox.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	then := r.then
	r.mu.Unlock()
	if then != nil {
		then(e)
	}
}

// outcomes returns the outcomes recorded for message id, in order.
func (r *recorder) outcomes(id string) []inbox.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []inbox.Outcome
	for _, e := range r.events {
		if e.MessageID == id {
			out = append(out, e.Outcome)
		}
	}
	return out
}

func (r *recorder) all() []inbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]inbox.Event(nil), r.events...)
}

func (r *recorder) last(t *testing.T) inbox.Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.events, "no delivery settled")
	return r.events[len(r.events)-1]
}

// deliver hands one delivery to the middleware the way the router does: a
// message of its own, carrying the delivery's context.
func deliver(ctx context.Context, mw message.HandlerFunc, id string, payload []byte) error {
	msg := message.NewMessage(id, payload)
	msg.SetContext(ctx)
	_, err := mw(msg)
	return err
}

// deliverConcurrently delivers the same message n times at once and fails the
// test if any delivery returns an error.
func deliverConcurrently(t *testing.T, ctx context.Context, mw message.HandlerFunc, id string, payload []byte, n int) {
	t.Helper()
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs <- deliver(ctx, mw, id, payload)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// holdUntilContended makes the first run of the handler for a message wait,
// with its inbox row inserted but not committed, until n other transactions
// of the database are blocked on a lock (the concurrent deliveries' INSERTs
// waiting on that row), or until the handler runs a second time (no dedupe).
// It makes the concurrent test exercise the path where the INSERTs really
// overlap, instead of hoping the scheduler interleaves them.
func holdUntilContended(t *testing.T, b *testBundle, n int) func(*message.Message, int) error {
	return func(msg *message.Message, call int) error {
		if call != 1 {
			return nil
		}
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if b.handler.callsFor(msg.UUID) > 1 {
				return nil
			}
			waiting, err := lockWaiters(b)
			if err != nil {
				t.Errorf("counting lock waiters: %v", err)
				return nil
			}
			if waiting >= n {
				return nil
			}
			time.Sleep(5 * time.Millisecond) // polling a condition, not waiting for one to settle
		}
		t.Errorf("the other %d deliveries never blocked on the inbox row", n)
		return nil
	}
}

// lockWaiters counts the transactions of the bundle's database that wait on a
// lock: deliveries whose INSERT waits on another's uncommitted inbox row.
func lockWaiters(b *testBundle) (int, error) {
	var n int
	err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
	return n, err
}

// awaitLockWaiters returns once n transactions wait on a lock, and fails the
// test after 10s. It may run on any goroutine.
func awaitLockWaiters(t *testing.T, b *testBundle, n int, what string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		waiting, err := lockWaiters(b)
		if err != nil {
			t.Errorf("counting lock waiters: %v", err)
			return
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not waiting for one to settle
	}
}

// eventually polls cond every 20ms until it holds, and fails the test after
// timeout.
func eventually(t *testing.T, cond func() bool, timeout time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

func newID() string { return uuid.NewString() }

func sha(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

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

	t.Run("PayloadConflictQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		id := newID()
		original, conflicting := []byte(`{"amount":100}`), []byte(`{"amount":999}`)

		require.NoError(t, deliver(b.ctx, mw, id, original))
		require.NoError(t, deliver(b.ctx, mw, id, conflicting))

		require.Equal(t, 1, b.handler.callsFor(id), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Conflict}, b.events.outcomes(id))
		require.Contains(t, b.events.last(t).Reason, fmt.Sprintf("%x", sha(original)))
		var kind string
		var payloadSum, originalSum, stored []byte
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, payload_sha256, original_sha256, payload FROM inbox_quarantine
			WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&kind, &payloadSum, &originalSum, &stored))
		require.Equal(t, "payload_conflict", kind)
		require.Equal(t, sha(conflicting), payloadSum)
		require.Equal(t, sha(original), originalSum)
		require.Equal(t, conflicting, stored)

		// The same conflicting payload again: settled as a conflict, recorded once.
		require.NoError(t, deliver(b.ctx, mw, id, conflicting))
		require.Equal(t, 1, b.handler.callsFor(id))
		require.Equal(t, inbox.Conflict, b.events.last(t).Outcome)
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, id), "a conflict is no duplicate")
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
	})

	t.Run("MissingIDQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), "", []byte(`{"amount":100}`)), "an invalid message is acknowledged")

		require.Equal(t, 0, b.handler.callsFor(""), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(""))
		var kind, reason string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, reason FROM inbox_quarantine WHERE consumer = $1`, consumer).Scan(&kind, &reason))
		require.Equal(t, "invalid", kind)
		require.Contains(t, reason, "no id")
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM applied`))
	})

	t.Run("OversizedPayloadQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxPayloadBytes: 8})
		mw := in.Middleware(b.handler.handle)
		fits, tooBig := newID(), newID()

		require.NoError(t, deliver(b.ctx, mw, fits, []byte("12345678")))
		require.NoError(t, deliver(b.ctx, mw, tooBig, []byte("123456789")))

		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(fits), "a payload of exactly the limit")
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(tooBig))
		require.Equal(t, 0, b.handler.callsFor(tooBig), "handler runs")
		var kind, reason string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, reason FROM inbox_quarantine WHERE message_id = $1`, tooBig).Scan(&kind, &reason))
		require.Equal(t, "invalid", kind)
		require.Contains(t, reason, "8-byte limit")
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, tooBig))

		// Redelivered: quarantined once.
		require.NoError(t, deliver(b.ctx, mw, tooBig, []byte("123456789")))
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`))
	})

	// Ids the inbox's indexes cannot hold are quarantined, not handed back to
	// the broker, which would redeliver them forever.
	t.Run("UnstorableIDQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		ids := map[string]string{
			"abc\x00def":                 "not valid UTF-8 text",
			"abc\xffdef":                 "not valid UTF-8 text",
			strings.Repeat(newID(), 100): "exceeds the 1024-byte limit", // 3.6 kB
		}
		for id, want := range ids {
			require.NoError(t, deliver(b.ctx, mw, id, []byte(id)), want)
			e := b.events.last(t)
			require.Equal(t, inbox.Invalid, e.Outcome, want)
			require.Contains(t, e.Reason, want)
			require.Equal(t, 0, b.handler.callsFor(id), want)
		}
		require.Equal(t, 3, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'invalid'`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
	})

	// An id in another spelling of an applied message's UUID is a new key
	// to the inbox: without CheckID the copy is applied again.
	t.Run("IDNotInIssuedFormatQuarantined", func(t *testing.T) {
		t.Parallel()
		for _, check := range []bool{true, false} {
			cfg := inbox.Config{}
			if check {
				cfg.CheckID = inbox.CanonicalUUID
			}
			in, b := setup(t, cfg)
			mw := in.Middleware(b.handler.handle)
			id, payload := newID(), []byte(`{"amount":100}`)
			spellings := []string{strings.ToUpper(id), "{" + id + "}", "urn:uuid:" + id, strings.ReplaceAll(id, "-", "")}
			require.NoError(t, deliver(b.ctx, mw, id, payload))
			for _, other := range spellings {
				require.NoError(t, deliver(b.ctx, mw, other, payload))
			}
			applied := scalar[int](t, b, `SELECT count(*) FROM applied`)
			if !check {
				require.Equal(t, 1+len(spellings), applied, "the control: without CheckID every spelling is applied")
				continue
			}
			require.Equal(t, 1, applied, "only the issued spelling is applied")
			for _, other := range spellings {
				require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(other), other)
				require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'invalid' AND message_id = $1 AND reason LIKE '%not in the issued format%'`, other), other)
			}
			require.NoError(t, inbox.CanonicalUUID(id))
		}
	})

	// A handler error or a header holding what Postgres text cannot (a NUL
	// byte, invalid UTF-8) is still recorded: the message is retried and
	// dead-lettered like any other.
	t.Run("UnstorableTextStillDeadLetters", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
		b.handler.hook = func(*message.Message, int) error { return errors.New("bad byte \x00 and \xff in field") }
		id := newID()
		msg := message.NewMessage(id, []byte(`{}`))
		msg.Metadata.Set("note", "a\x00b")
		msg.SetContext(b.ctx)

		_, err := in.Middleware(b.handler.handle)(msg)
		require.NoError(t, err)

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, "bad byte \uFFFD and \uFFFD in field",
			scalar[string](t, b, `SELECT substring(reason from 'bad byte.*field') FROM inbox_quarantine WHERE message_id = $1`, id))
		require.Equal(t, "a\uFFFDb", scalar[string](t, b, `SELECT metadata->>'note' FROM inbox_quarantine WHERE message_id = $1`, id))
		require.Equal(t, "a\uFFFDb", scalar[string](t, b, `SELECT metadata->>'note' FROM outbox_messages WHERE topic = $1`, consumer+".dlq"))
	})

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

	t.Run("DedupeIsPerConsumer", func(t *testing.T) {
		t.Parallel()
		billing, b := setup(t, inbox.Config{Consumer: "billing"})
		shipping := b.newInbox(t, inbox.Config{Consumer: "shipping"})
		shippingHandler := &applier{consumer: "shipping"}
		id, payload := newID(), []byte(`{"order":1}`)

		for range 2 {
			require.NoError(t, deliver(b.ctx, billing.Middleware(b.handler.handle), id, payload))
			require.NoError(t, deliver(b.ctx, shipping.Middleware(shippingHandler.handle), id, payload))
		}

		require.Equal(t, 1, appliedRows(t, b, "billing", id))
		require.Equal(t, 1, appliedRows(t, b, "shipping", id))
		require.Equal(t, inbox.Stats{Applied: 1, Duplicates: 1}, billing.Stats())
		require.Equal(t, inbox.Stats{Applied: 1, Duplicates: 1}, shipping.Stats())
		require.Equal(t, 2, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, id))
	})

	// The control runs: without the inbox row the same deliveries are applied
	// more than once. They show that the tests above can fail.
	t.Run("DisableDedupeAppliesConcurrentDeliveriesEach", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{DisableDedupe: true})
		b.handler.hook = holdUntilContended(t, b, 9)
		id := newID()

		deliverConcurrently(t, b.ctx, in.Middleware(b.handler.handle), id, []byte(`{"amount":100}`), 10)

		require.Equal(t, 10, appliedRows(t, b, consumer, id))
		require.Equal(t, int64(10), in.Stats().Applied)
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
	})

	t.Run("DisableDedupeAppliesRedeliveryTwice", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{DisableDedupe: true})
		mw := in.Middleware(b.handler.handle)
		id, payload := newID(), []byte(`{"amount":100}`)

		require.NoError(t, deliver(b.ctx, mw, id, payload))
		require.NoError(t, deliver(b.ctx, mw, id, payload))

		require.Equal(t, 2, appliedRows(t, b, consumer, id))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Applied}, b.events.outcomes(id))
	})
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	// The pool is never used: pgxpool connects lazily.
	pool, err := pgxpool.New(context.Background(), pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	tests := []struct {
		name    string
		cfg     inbox.Config
		wantErr []string // substrings of the error; none: valid
	}{
		{"Defaults", inbox.Config{Pool: pool, Consumer: "c"}, nil},
		{"NoPool", inbox.Config{Consumer: "c"}, []string{"Config.Pool"}},
		{"NoConsumer", inbox.Config{Pool: pool}, []string{"Config.Consumer"}},
		{"NegativeMaxAttempts", inbox.Config{Pool: pool, Consumer: "c", MaxAttempts: -1}, []string{"Config.MaxAttempts"}},
		{"NegativeMaxPayloadBytes", inbox.Config{Pool: pool, Consumer: "c", MaxPayloadBytes: -1}, []string{"Config.MaxPayloadBytes"}},
		{"NegativeBatchLinger", inbox.Config{Pool: pool, Consumer: "c", BatchLinger: -time.Millisecond}, []string{"Config.BatchLinger"}},
		{"RetentionBelowDefaultHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: time.Hour},
			[]string{"Config.Retention", "Config.RedeliveryHorizon"}},
		{"RetentionBelowHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: 24 * time.Hour, RedeliveryHorizon: 48 * time.Hour},
			[]string{"Config.Retention", "Config.RedeliveryHorizon", "24h0m0s", "48h0m0s"}},
		{"RetentionEqualsHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: time.Hour, RedeliveryHorizon: time.Hour}, nil},
		{"NegativeRetentionInterval", inbox.Config{Pool: pool, Consumer: "c", RetentionInterval: -time.Second}, []string{"Config.RetentionInterval"}},
		{"NegativeTxTimeout", inbox.Config{Pool: pool, Consumer: "c", TxTimeout: -time.Second}, []string{"Config.TxTimeout"}},
		{"LogStartWithoutPosition", inbox.Config{Pool: pool, Consumer: "c",
			LogStart: func(context.Context) (inbox.LogStart, error) { return nil, nil }}, []string{"Config.LogStart", "Config.Position"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in, err := inbox.New(tt.cfg)
			if tt.wantErr == nil {
				require.NoError(t, err)
				require.NotNil(t, in)
				return
			}
			require.Error(t, err)
			require.Nil(t, in)
			for _, s := range tt.wantErr {
				require.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	const week = 7 * 24 * time.Hour
	billing, b := setup(t, inbox.Config{Consumer: "billing", RetentionBatch: 2, Retention: week})
	shipping := b.newInbox(t, inbox.Config{Consumer: "shipping", Retention: week})

	deliverN := func(in *inbox.Inbox, n int) []string {
		h := &applier{consumer: in.Consumer()}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = newID()
			require.NoError(t, deliver(b.ctx, in.Middleware(h.handle), ids[i], []byte(ids[i])))
		}
		return ids
	}
	billingIDs, shippingIDs := deliverN(billing, 8), deliverN(shipping, 3)
	backdate := func(age string, consumer string, ids []string) {
		_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - $1::interval
			WHERE consumer = $2 AND message_id = ANY($3)`, age, consumer, ids)
		require.NoError(t, err)
	}
	backdate("8 days", "billing", billingIDs[:5])  // past retention
	backdate("6 days", "billing", billingIDs[5:6]) // within it
	backdate("8 days", "shipping", shippingIDs)    // past retention, another consumer's

	// Stale and fresh attempt counters.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_attempts (consumer, message_id, attempts, last_error, updated_at) VALUES
		('billing', 'stale', 1, 'x', now() - interval '8 days'),
		('billing', 'fresh', 1, 'x', now()),
		('shipping', 'stale', 1, 'x', now() - interval '8 days')`)
	require.NoError(t, err)

	deleted, err := billing.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), deleted, "five old rows, in batches of two")

	remaining := func(consumer string) []string {
		rows, err := b.pool.Query(b.ctx, `SELECT message_id FROM inbox_messages WHERE consumer = $1 ORDER BY message_id`, consumer)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	require.ElementsMatch(t, billingIDs[5:], remaining("billing"))
	require.ElementsMatch(t, shippingIDs, remaining("shipping"), "another consumer's rows are not swept")
	require.ElementsMatch(t, []string{"billing/fresh", "shipping/stale"},
		func() []string {
			rows, err := b.pool.Query(b.ctx, `SELECT consumer || '/' || message_id FROM inbox_attempts`)
			require.NoError(t, err)
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return keys
		}())

	deleted, err = billing.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, deleted)
}

// TestRouterWithKafka runs the middleware where it lives: in a Watermill
// router, behind a watermill-kafka subscriber, against a real broker.
// consumeThroughKafka runs a Watermill router that consumes topic as group
// through in's middleware into b's handler, until the test ends, and returns
// a publisher onto Kafka.
func consumeThroughKafka(t *testing.T, b *testBundle, in *inbox.Inbox, topic, group string) message.Publisher {
	t.Helper()
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	logger := watermill.NopLogger{}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: group,
	}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("apply", topic, sub, func(msg *message.Message) error {
		_, err := b.handler.handle(msg)
		return err
	}).AddMiddleware(in.Middleware)

	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
	})
	select {
	case <-router.Running():
	case <-b.ctx.Done():
		t.Fatal("router did not start")
	}

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(),
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func TestRouterWithKafka(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond})
	poisonErr := errors.New("poison pill")
	b.handler.hook = func(msg *message.Message, _ int) error {
		if bytes.Equal(msg.Payload, []byte("poison")) {
			return poisonErr
		}
		return nil
	}

	suffix := watermill.NewShortUUID()
	topic, group := "inbox-test-"+suffix, "inbox-test-"+suffix
	require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic))
	pub := consumeThroughKafka(t, b, in, topic, group)

	// Poison first, then a good message with the same key: same partition,
	// so the good one waits behind the poison until the inbox settles it.
	poison := outbox.NewMessage("order-1", []byte("poison"))
	good := outbox.NewMessage("order-1", []byte("good"))
	// One message published twice, as a relay that died before marking its
	// batch would.
	twice := outbox.NewMessage("order-2", []byte("twice"))
	again := message.NewMessage(twice.UUID, twice.Payload)
	again.Metadata.Set(outbox.KeyMetadata, twice.Metadata.Get(outbox.KeyMetadata))
	start := time.Now()
	require.NoError(t, pub.Publish(topic, poison, good, twice, again))

	status := func(id string) string {
		var s string
		err := b.pool.QueryRow(b.ctx, `SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&s)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			require.NoError(t, err)
		}
		return s
	}
	eventually(t, func() bool { return status(good.UUID) == "processed" }, 20*time.Second, "the good message to be applied")
	eventually(t, func() bool {
		return scalar[int](t, b, `SELECT coalesce(sum(duplicates), 0) FROM inbox_messages WHERE message_id = $1`, twice.UUID) == 1
	}, 20*time.Second, "the second copy to be suppressed")
	t.Logf("settled %v after publishing", time.Since(start))

	require.Equal(t, "dead_lettered", status(poison.UUID))
	require.Equal(t, 3, b.handler.callsFor(poison.UUID), "poison runs: MaxAttempts, then acknowledged")
	require.Equal(t, 0, appliedRows(t, b, consumer, poison.UUID))
	require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.Retried, inbox.DeadLettered}, b.events.outcomes(poison.UUID))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'dead_letter' AND message_id = $1`, poison.UUID))
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, consumer+".dlq"))

	require.Equal(t, 1, appliedRows(t, b, consumer, good.UUID))
	require.Equal(t, 1, appliedRows(t, b, consumer, twice.UUID))
	require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, b.events.outcomes(twice.UUID))
	require.Equal(t, topic, scalar[string](t, b, `SELECT topic FROM inbox_messages WHERE message_id = $1`, good.UUID))

	// In partition order: the poison was settled before the good message ran.
	var settled []string
	for _, e := range b.events.all() {
		if e.Outcome != inbox.Retried && (e.MessageID == poison.UUID || e.MessageID == good.UUID) {
			settled = append(settled, string(e.Outcome))
		}
	}
	require.Equal(t, []string{"dead_lettered", "applied"}, settled)

	// Every delivery was acknowledged, the poison included: the group's
	// committed offsets reach the end of the topic.
	admin, err := sarama.NewClusterAdmin(kfk.Brokers(), kafkatest.Sarama())
	require.NoError(t, err)
	defer admin.Close()
	eventually(t, func() bool { return committedOffsets(t, admin, group, topic) == 4 }, 10*time.Second, "offsets of all four messages to be committed")
}

// committedOffsets sums the offsets group has committed on topic's partitions.
func committedOffsets(t *testing.T, admin sarama.ClusterAdmin, group, topic string) int64 {
	t.Helper()
	resp, err := admin.ListConsumerGroupOffsets(group, nil) // nil: every partition
	require.NoError(t, err)
	var sum int64
	for _, block := range resp.Blocks[topic] {
		if block.Offset > 0 {
			sum += block.Offset
		}
	}
	return sum
}

// TestMigrateCreatesTheDeadLetterPath: dead letters are published through
// the outbox, so inbox.Migrate alone must leave a database where a poison
// message is dead-lettered, not one where the dead letter fails for want of
// outbox_messages and the message comes back forever.
func TestMigrateCreatesTheDeadLetterPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name, url, err := createDatabase(ctx)
	require.NoError(t, err)
	pg.DropWhenDone(t, name)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, inbox.Migrate(ctx, pool)) // and nothing else

	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer})
	require.NoError(t, err)
	poison := func(*message.Message) ([]*message.Message, error) {
		return nil, inbox.Permanent(errors.New("unreadable"))
	}
	require.NoError(t, deliver(ctx, in.Middleware(poison), newID(), []byte(`{}`)))
	require.Equal(t, int64(1), in.Stats().DeadLettered)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, consumer+".dlq").Scan(&n))
	require.Equal(t, 1, n, "the dead letter waits in the outbox")
}
