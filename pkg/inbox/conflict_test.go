package inbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestConflictRace delivers one id twice at once with different payloads. A
// (payload 1) inserts its inbox row first and B (payload 2) waits on it; A's
// handler fails for good and rolls back, which releases B: B inserts its row
// and is applied while A goes on to record its dead letter, whose INSERT
// then finds B's row. A's payload is not B's, so A must end quarantined as a
// payload conflict with both hashes, not be settled as a duplicate of a
// message it is not (issue #14, item 5).
//
// Each run forces that order, with no sleeps: A's handler starts B and fails
// only once B's INSERT waits on A's row; A's next transaction cannot take a
// connection until B's handler runs (so B holds the row), and B's handler
// returns only once A's dead-letter INSERT waits on B's row.
//
// RetryFindsTheRow is the same race where A is retried instead: its next
// attempt finds B's row. That path compared the hashes already; it is here
// so that every way A can meet B's row is covered.
func TestConflictRace(t *testing.T) {
	t.Parallel()
	permanent := inbox.Permanent(errors.New("unknown schema version 9"))

	tests := []struct {
		name string
		cfg  inbox.Config
		fail error // what A's handler returns
		// set delivers through Handler (a BatchFunc) instead of Middleware.
		set bool
		// failingCall is A's handler call that fails for good: behind
		// Handler, A's failed batch is first tried again alone.
		failingCall int32
		retries     int64 // A's failed attempts before it finds B's row
	}{
		{name: "PermanentError", cfg: inbox.Config{}, fail: permanent, failingCall: 1},
		{name: "MaxAttempts", cfg: inbox.Config{MaxAttempts: 1}, fail: errors.New("ledger unavailable"), failingCall: 1},
		{name: "SavepointBatch", cfg: inbox.Config{BatchSize: 8}, fail: permanent, failingCall: 1},
		{name: "Handler", cfg: inbox.Config{BatchSize: 8}, fail: permanent, set: true, failingCall: 2},
		{name: "RetryFindsTheRow", cfg: inbox.Config{MaxAttempts: 3, RetryBackoff: time.Millisecond},
			fail: errors.New("ledger unavailable"), failingCall: 1, retries: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, b := setup(t, inbox.Config{})
			race := &conflictRace{
				t: t, b: b, fail: tt.fail, failingCall: tt.failingCall,
				payloadA: []byte(`{"amount":100}`), payloadB: []byte(`{"amount":999}`),
				startB: make(chan struct{}), bRunning: make(chan struct{}),
			}
			cfg := tt.cfg
			cfg.Pool = race.gatedPool()
			in := b.newInbox(t, cfg)

			var h func(msg *message.Message) error
			if tt.set {
				h = in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
					for _, msg := range msgs {
						if _, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, 1)`, in.Consumer(), msg.UUID); err != nil {
							return err
						}
						if err := race.apply(msg); err != nil {
							return err
						}
					}
					return nil
				})
			} else {
				b.handler.hook = func(msg *message.Message, _ int) error { return race.apply(msg) }
				mw := in.Middleware(b.handler.handle)
				h = func(msg *message.Message) error { _, err := mw(msg); return err }
			}
			id := newID()

			race.run(h, id)

			want := []inbox.Outcome{inbox.Applied, inbox.Conflict}
			for range tt.retries {
				want = append(want, inbox.Retried)
			}
			require.ElementsMatch(t, want, b.events.outcomes(id), "B applied, A quarantined as a conflict")
			require.Equal(t, inbox.Stats{Applied: 1, Conflicts: 1, Retries: tt.retries}, in.Stats())
			for _, e := range b.events.all() {
				if e.Outcome == inbox.Conflict {
					require.Contains(t, e.Reason, fmt.Sprintf("%x", sha(race.payloadA)))
					require.Contains(t, e.Reason, fmt.Sprintf("%x", sha(race.payloadB)))
				}
			}

			var status string
			var sum []byte
			var duplicates int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status, payload_sha256, duplicates FROM inbox_messages
				WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&status, &sum, &duplicates))
			require.Equal(t, "processed", status)
			require.Equal(t, sha(race.payloadB), sum, "the inbox row is B's")
			require.Zero(t, duplicates, "a conflict is no duplicate")
			require.Equal(t, 1, appliedRows(t, b, consumer, id), "A's writes were rolled back")

			var kind string
			var payloadSum, originalSum, stored []byte
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, payload_sha256, original_sha256, payload FROM inbox_quarantine
				WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&kind, &payloadSum, &originalSum, &stored))
			require.Equal(t, inbox.KindPayloadConflict, kind)
			require.Equal(t, sha(race.payloadA), payloadSum)
			require.Equal(t, sha(race.payloadB), originalSum)
			require.Equal(t, race.payloadA, stored, "A's payload is kept")
			require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`), "no dead letter beside the conflict")
			require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM outbox_messages`), "no dead letter published")
		})
	}

	// The other order: A's dead letter is committed first, and B, delivered
	// after it, is a conflict with the dead-lettered payload.
	t.Run("DeadLetterFirst", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		payloadA, payloadB := []byte(`{"amount":100}`), []byte(`{"amount":999}`)
		b.handler.hook = func(msg *message.Message, _ int) error {
			if bytes.Equal(msg.Payload, payloadA) {
				return permanent
			}
			return nil
		}
		mw := in.Middleware(b.handler.handle)
		id := newID()

		require.NoError(t, deliver(b.ctx, mw, id, payloadA))
		require.NoError(t, deliver(b.ctx, mw, id, payloadB))

		require.Equal(t, []inbox.Outcome{inbox.DeadLettered, inbox.Conflict}, b.events.outcomes(id))
		require.Equal(t, 1, b.handler.callsFor(id), "B's handler did not run")
		require.Equal(t, 0, appliedRows(t, b, consumer, id))
		var payloadSum, originalSum []byte
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload_sha256, original_sha256 FROM inbox_quarantine
			WHERE consumer = $1 AND message_id = $2 AND kind = $3`, consumer, id, inbox.KindPayloadConflict).Scan(&payloadSum, &originalSum))
		require.Equal(t, sha(payloadB), payloadSum)
		require.Equal(t, sha(payloadA), originalSum)
		require.Contains(t, b.events.last(t).Reason, "dead-lettered")
	})
}

// conflictRace is the schedule of TestConflictRace's two deliveries.
type conflictRace struct {
	t                  *testing.T
	b                  *testBundle
	payloadA, payloadB []byte
	fail               error
	failingCall        int32

	aCalls   atomic.Int32
	aFailed  atomic.Bool   // A's handler failed for good
	startB   chan struct{} // closed when B is to be delivered
	bRunning chan struct{} // closed when B's handler runs: B holds the row
	bOnce    sync.Once
}

// gateKey marks the context of A's delivery, which the gated pool sees when
// A's transactions take a connection.
type gateKey struct{}

// gatedPool returns a pool on the test's database that holds back A's
// transactions after A failed for good (its dead letter) until B holds the
// row. Without it, A's dead-letter INSERT and B's released INSERT race for
// the row.
func (r *conflictRace) gatedPool() *pgxpool.Pool {
	cfg := r.b.pool.Config()
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if ctx.Value(gateKey{}) != nil && r.aFailed.Load() {
			select {
			case <-r.bRunning:
			case <-time.After(10 * time.Second):
				r.t.Error("B's handler never ran")
			}
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(r.b.ctx, cfg)
	require.NoError(r.t, err)
	r.t.Cleanup(pool.Close)
	return pool
}

// apply is the handler's part for one message, after its domain write.
func (r *conflictRace) apply(msg *message.Message) error {
	if bytes.Equal(msg.Payload, r.payloadB) {
		r.bOnce.Do(func() { close(r.bRunning) })
		// B's row stays uncommitted until A's dead-letter INSERT waits on it.
		awaitLockWaiters(r.t, r.b, 1, "A's dead letter to wait on B's inbox row")
		return nil
	}
	if r.aCalls.Add(1) < r.failingCall {
		return r.fail // A's batch; B is not there yet
	}
	close(r.startB)
	awaitLockWaiters(r.t, r.b, 1, "B to wait on A's inbox row")
	r.aFailed.Store(true)
	return r.fail
}

// run delivers A, and B once A's handler asks for it, through h, and fails
// the test if either delivery returns an error.
func (r *conflictRace) run(h func(*message.Message) error, id string) {
	deliverTo := func(ctx context.Context, payload []byte) error {
		msg := message.NewMessage(id, payload)
		msg.SetContext(ctx)
		return h(msg)
	}
	errs := make(chan error, 2)
	go func() { errs <- deliverTo(context.WithValue(r.b.ctx, gateKey{}, true), r.payloadA) }()
	go func() {
		select {
		case <-r.startB:
			errs <- deliverTo(r.b.ctx, r.payloadB)
		case <-r.b.ctx.Done():
			errs <- fmt.Errorf("B was never delivered: %w", r.b.ctx.Err())
		}
	}()
	for range 2 {
		require.NoError(r.t, <-errs)
	}
}
