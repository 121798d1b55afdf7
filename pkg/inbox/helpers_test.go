package inbox_test

import (
	"context"
	"crypto/sha256"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
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

// count is how many events were recorded: a wait's measure of progress.
func (r *recorder) count() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.events))
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

// eventually polls cond every 20ms until it holds. It fails the test when
// cond has not held for timeout and nothing moved meanwhile: each progress
// measure (the deliveries settled, a committed offset) is read at every
// poll, and a change restarts the wait, so a busy machine makes the wait
// longer, never a failure.
func eventually(t *testing.T, cond func() bool, timeout time.Duration, what string, progress ...func() int64) {
	t.Helper()
	read := func() []int64 {
		var v []int64
		for _, p := range progress {
			v = append(v, p())
		}
		return v
	}
	deadline, last := time.Now().Add(timeout), read()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if now := read(); !slices.Equal(now, last) {
			deadline, last = time.Now().Add(timeout), now // moving: a busy machine is slow, not stuck
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: nothing moved for %v (%v)", what, timeout, last)
		}
		<-tick.C
	}
}

func newID() string { return uuid.NewString() }

func sha(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

// runRouterAndRelay runs router and relay until the test ends, and returns
// once the router runs (failing if it has not by the end of ready).
func runRouterAndRelay(t *testing.T, ready context.Context, router *message.Router, relay *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runErr, relayErr := make(chan error, 1), make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	go func() { relayErr <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
		require.NoError(t, <-relayErr)
	})
	select {
	case <-router.Running():
	case <-ready.Done():
		t.Fatal("router did not start")
	}
}
