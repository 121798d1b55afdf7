package effect_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var testPG *pgtest.Server

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

// runTests starts Postgres for the tests, and for Example a database and
// an in-process Kafka-protocol broker, found the way a reader's program
// finds them: DATABASE_URL and KAFKA_BROKERS.
func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if testPG, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "effect tests:", err)
		return 1
	}
	defer testPG.Stop() //nolint:errcheck // best effort
	kfk, err := kafkatest.Start(ctx, kafkatest.Options{Partitions: 3})
	if err != nil {
		fmt.Fprintln(os.Stderr, "effect tests:", err)
		return 1
	}
	defer kfk.Close()
	name := fmt.Sprintf("effect_examples_%d", os.Getpid())
	url, err := testPG.CreateDatabase(ctx, name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "effect tests:", err)
		return 1
	}
	testPG.DropAtStop(name)
	if err := errors.Join(os.Setenv("DATABASE_URL", url), os.Setenv("KAFKA_BROKERS", strings.Join(kfk.Brokers(), ","))); err != nil {
		fmt.Fprintln(os.Stderr, "effect tests:", err)
		return 1
	}
	return m.Run()
}

// newPool returns a pool on a fresh database with the effects table and a
// domain table, outcomes, that Record writes to.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testPG.TestDatabase(t)
	require.NoError(t, effect.Migrate(t.Context(), pool))
	_, err := pool.Exec(t.Context(), `CREATE TABLE outcomes (key text NOT NULL, result text NOT NULL, failed bool NOT NULL)`)
	require.NoError(t, err)
	return pool
}

// enqueue records n effects of kind "charge", keys k0..k(n-1), one
// transaction each.
func enqueue(t *testing.T, pool *pgxpool.Pool, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		require.NoError(t, pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
			_, err := effect.EnqueueTx(context.Background(), tx, "charge", keys[i], []byte(fmt.Sprint(i)))
			return err
		}))
	}
	return keys
}

// world is the outside system: it performs a call once per idempotency
// key, unless honourKeys is off, and fails as told.
type world struct {
	honourKeys bool
	mu         sync.Mutex
	performed  map[string]int    // key → times performed
	stored     map[string]string // key → the stored outcome
	calls      int
	// fail(call number, key) says how this call fails: "" (it does not),
	// "before" (a 5xx, nothing done), "lost" (done, the answer lost).
	fail func(n int, key string) string
}

func newWorld(honourKeys bool, fail func(int, string) string) *world {
	if fail == nil {
		fail = func(int, string) string { return "" }
	}
	return &world{honourKeys: honourKeys, performed: map[string]int{}, stored: map[string]string{}, fail: fail}
}

func (w *world) do(_ context.Context, e effect.Effect) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls++
	how := w.fail(w.calls, e.Key)
	if how == "before" {
		return "", errors.New("503: nothing done")
	}
	out, ok := w.stored[e.Key]
	if !ok || !w.honourKeys {
		w.performed[e.Key]++
		out = fmt.Sprintf("charged %s (#%d)", e.Payload, w.performed[e.Key])
		w.stored[e.Key] = out
	}
	if how == "lost" {
		return "", errors.New("connection reset: the answer was lost")
	}
	return out, nil
}

func record(ctx context.Context, tx pgx.Tx, e effect.Effect, result string, err error) error {
	if err != nil {
		result = err.Error()
	}
	_, xerr := tx.Exec(ctx, `INSERT INTO outcomes VALUES ($1, $2, $3)`, e.Key, result, err != nil)
	return xerr
}

func start(t *testing.T, cfg effect.Config[string], adjust ...func(*effect.Config[string])) *effect.Runner[string] {
	t.Helper()
	cfg.Kind = "charge"
	if cfg.Record == nil {
		cfg.Record = record
	}
	for _, f := range adjust {
		f(&cfg)
	}
	cfg.MinBackoff, cfg.MaxBackoff, cfg.PollInterval = 5*time.Millisecond, 20*time.Millisecond, 10*time.Millisecond
	r, err := effect.NewRunner(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return r
}

// waitEnded waits until no effect is pending and returns the outcomes
// recorded per key.
// waitNonePending waits until no effect of kind "charge" is pending, as long
// as the runner works at them (an attempt made or an effect ended): it fails
// when nothing moved for stuck. A deadline for the whole wait failed on a
// busy machine while the runner was still at them (2,000 effects, each
// declined once, one connection, every plan explained, beside a chaos run).
func waitNonePending(t *testing.T, pool *pgxpool.Pool, stuck time.Duration) {
	t.Helper()
	var last string
	moved := time.Now()
	for {
		var pending, attempts int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state NOT IN ('done', 'failed')),
			coalesce(sum(attempts), 0) FROM effects WHERE kind = 'charge'`).Scan(&pending, &attempts)
		now := fmt.Sprint(pending, attempts)
		switch {
		case err == nil && pending == 0:
			return
		case err == nil && now != last:
			last, moved = now, time.Now()
		case time.Since(moved) > stuck:
			t.Fatalf("effects still pending, nothing attempted or ended for %s (pending, attempts: %s; last error: %v)", stuck, last, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitEnded(t *testing.T, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	ctx := context.Background()
	waitNonePending(t, pool, 20*time.Second)
	rows, err := pool.Query(ctx, `SELECT key, result FROM outcomes ORDER BY key`)
	require.NoError(t, err)
	got := map[string][]string{}
	var k, v string
	_, err = pgx.ForEachRow(rows, []any{&k, &v}, func() error { got[k] = append(got[k], v); return nil })
	require.NoError(t, err)
	return got
}

// Every third call fails before doing anything, every fifth is performed
// and its answer lost: with keys honoured, each effect is performed once
// and recorded once. The same faults against a world that ignores the key
// perform the lost ones twice: the check below can see it.
func TestOncePerKeyThroughFailures(t *testing.T) {
	faults := func(n int, _ string) string {
		switch {
		case n%3 == 0:
			return "before"
		case n%5 == 0:
			return "lost"
		}
		return ""
	}
	for _, tc := range []struct {
		name       string
		honourKeys bool
	}{{"KeysHonoured", true}, {"KeysIgnored", false}} {
		t.Run(tc.name, func(t *testing.T) {
			pool := newPool(t)
			keys := enqueue(t, pool, 60)
			w := newWorld(tc.honourKeys, faults)
			r := start(t, effect.Config[string]{Pool: pool, Do: w.do, Workers: 3})
			got := waitEnded(t, pool)

			twice := 0
			for _, k := range keys {
				require.Len(t, got[k], 1, "key %s recorded %d times", k, len(got[k]))
				if w.performed[k] != 1 {
					twice++
				}
			}
			require.Greater(t, r.Stats().Retried, int64(10), "the faults never hit")
			if tc.honourKeys {
				require.Zero(t, twice, "keys honoured, yet %d effects were performed more than once", twice)
				for _, k := range keys {
					require.Contains(t, got[k][0], "(#1)", "key %s recorded an outcome other than the first", k)
				}
			} else {
				require.Greater(t, twice, 3, "without keys, the lost answers must have been performed again")
			}
		})
	}
}

// Asking twice for one effect records one intent.
func TestEnqueueOncePerKey(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	var firsts []bool
	for range 2 {
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			first, err := effect.EnqueueTx(ctx, tx, "charge", "order-1", []byte("x"))
			firsts = append(firsts, first)
			return err
		}))
	}
	require.Equal(t, []bool{true, false}, firsts)
	// A rolled-back transaction leaves no intent.
	require.Error(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := effect.EnqueueTx(ctx, tx, "charge", "order-2", []byte("y")); err != nil {
			return err
		}
		return errors.New("the domain change failed")
	}))
	s, err := effect.ReadStats(ctx, pool, "charge")
	require.NoError(t, err)
	require.Equal(t, 1, s.Pending)
}

// A batch records each key once, in the order given, whatever was recorded
// before it or earlier in it, and nothing when its transaction rolls back.
func TestEnqueueBatchOncePerKey(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	batch := func(intents ...effect.Intent) (n int, err error) {
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			n, err = effect.EnqueueBatchTx(ctx, tx, "charge", intents)
			return err
		})
		return n, err
	}
	n, err := batch(effect.Intent{Key: "c", Payload: []byte("1")}, effect.Intent{Key: "a", Payload: []byte("2")},
		effect.Intent{Key: "c", Payload: []byte("3")})
	require.NoError(t, err)
	require.Equal(t, 2, n, "a key repeated in the batch is recorded once")
	n, err = batch(effect.Intent{Key: "a", Payload: []byte("4")}, effect.Intent{Key: "b", Payload: []byte("5")})
	require.NoError(t, err)
	require.Equal(t, 1, n, "a key recorded before is not recorded again")
	n, err = batch()
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = batch(effect.Intent{Key: "d", Payload: []byte("6")}, effect.Intent{Payload: []byte("7")})
	require.ErrorContains(t, err, "has no key")
	require.Error(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := effect.EnqueueBatchTx(ctx, tx, "charge", []effect.Intent{{Key: "e", Payload: []byte("8")}}); err != nil {
			return err
		}
		return errors.New("the domain change failed")
	}))
	rows, err := pool.Query(ctx, `SELECT key || '=' || convert_from(payload, 'UTF8') FROM effects ORDER BY id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"c=1", "a=2", "b=5"}, got, "the first payload per key, in the order given")
}

// A permanent error ends the effect at once: one call, recorded as failed
// with its reason, never retried.
func TestPermanentEndsTheEffect(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 1)
	var mu sync.Mutex
	calls := 0
	start(t, effect.Config[string]{Pool: pool, Do: func(context.Context, effect.Effect) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return "", effect.Permanent(errors.New("422: key reused with another body"))
	}})
	got := waitEnded(t, pool)
	require.Equal(t, []string{"422: key reused with another body"}, got["k0"])
	s, err := effect.ReadStats(context.Background(), pool, "charge")
	require.NoError(t, err)
	require.Equal(t, effect.Stats{Failed: 1}, s)
	time.Sleep(100 * time.Millisecond) // a retry would have come by now
	mu.Lock()
	require.Equal(t, 1, calls)
	mu.Unlock()
}

// A runner whose call outlives its lease: a second runner claims the effect
// and calls again with the same key. The world performs it once, and one
// outcome is recorded; the slower runner's is discarded.
func TestLeaseExpiredMidCall(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 1)
	w := newWorld(true, nil)
	release := make(chan struct{})
	var calls atomic.Int32
	slow := func(ctx context.Context, e effect.Effect) (string, error) {
		out, err := w.do(ctx, e)
		if calls.Add(1) == 1 {
			<-release // the first call hangs after performing
		}
		return out, err
	}
	lease := 400 * time.Millisecond
	a := start(t, effect.Config[string]{Pool: pool, Do: slow, Lease: lease, Workers: 1})
	time.Sleep(50 * time.Millisecond)
	b := start(t, effect.Config[string]{Pool: pool, Do: slow, Lease: lease, Workers: 1})
	got := waitEnded(t, pool)
	close(release)
	require.Eventually(t, func() bool { return a.Stats().Overtook+b.Stats().Overtook == 1 }, 5*time.Second, 10*time.Millisecond,
		"the runner that outlived its lease must find the effect ended")
	require.Len(t, got["k0"], 1)
	require.Equal(t, 1, w.performed["k0"])
	require.GreaterOrEqual(t, w.calls, 2, "the second runner never called")
}

// A runner whose lease ran out while it called cannot move the due time of
// the runner that claimed the effect next: its failed call's retry is
// fenced by the attempt it claimed. Without the fence, the late failure
// makes the effect due at once and a third call starts inside the second
// runner's lease.
func TestLateRunnerCannotShortenTheLease(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 1)
	lease := 600 * time.Millisecond
	var calls atomic.Int32
	release := make(chan struct{})
	third := make(chan time.Time, 1)
	do := func(context.Context, effect.Effect) (string, error) {
		switch calls.Add(1) {
		case 1: // the late runner: outlives its lease, then fails
			<-release
			return "", errors.New("503 after a long wait")
		case 2: // the next claim: slow, inside its own lease
			close(release)
			time.Sleep(lease / 3)
			return "charged", nil
		default:
			third <- time.Now()
			return "charged", nil
		}
	}
	start(t, effect.Config[string]{Pool: pool, Do: do, Lease: lease, Workers: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	start(t, effect.Config[string]{Pool: pool, Do: do, Lease: lease, Workers: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	got := waitEnded(t, pool)
	require.Equal(t, []string{"charged"}, got["k0"])
	select {
	case <-third:
		t.Fatal("a third call started: the late runner's retry cut the second runner's lease short")
	case <-time.After(100 * time.Millisecond):
	}
}

// A Record that fails does not end the effect, nor repeat its call once a
// lease: the effect waits the backoff, and its last_error says why.
func TestRecordFailureIsRetriedVisibly(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 1)
	var calls atomic.Int32
	r, err := effect.NewRunner(effect.Config[string]{Pool: pool, Kind: "charge", Lease: time.Minute,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond,
		Do: func(context.Context, effect.Effect) (string, error) { calls.Add(1); return "charged", nil },
		Record: func(context.Context, pgx.Tx, effect.Effect, string, error) error {
			return errors.New("the order table is locked")
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return calls.Load() >= 3 }, 5*time.Second, 10*time.Millisecond,
		"a failed record must be retried after the backoff, not the minute-long lease")
	cancel()
	require.NoError(t, <-done)
	s, err := effect.ReadStats(context.Background(), pool, "charge")
	require.NoError(t, err)
	require.Equal(t, 1, s.Retrying, "the failing record must show as retrying")
	var lastErr string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT last_error FROM effects`).Scan(&lastErr))
	require.Contains(t, lastErr, "the order table is locked")
}

// together releases the first n calls at once: Do waits until n have
// started. The calls of the keys named late return 10 ms after the others.
func together(n int, late ...string) func(context.Context, effect.Effect) (string, error) {
	var wg sync.WaitGroup
	wg.Add(n)
	return func(_ context.Context, e effect.Effect) (string, error) {
		wg.Done()
		wg.Wait()
		if slices.Contains(late, e.Key) {
			time.Sleep(10 * time.Millisecond)
		}
		return "charged " + e.Key, nil
	}
}

// slowFirst makes the first call of f take 50 ms longer: the outcomes that
// return meanwhile wait for the next transaction, together.
func slowFirst() func() {
	var first atomic.Bool
	return func() {
		if first.CompareAndSwap(false, true) {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Calls that return together are recorded together: one transaction ends
// several effects (each Record sees the same transaction id), not one
// each.
func TestOutcomesReturnedTogetherShareATransaction(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 8)
	var mu sync.Mutex
	txOf := map[string]int64{}
	start(t, effect.Config[string]{Pool: pool, Workers: 8, Do: together(8),
		Record: func(ctx context.Context, tx pgx.Tx, e effect.Effect, result string, err error) error {
			var xid int64
			if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
				return err
			}
			mu.Lock()
			txOf[e.Key] = xid
			mu.Unlock()
			return record(ctx, tx, e, result, err)
		}})
	got := waitEnded(t, pool)
	require.Len(t, got, 8)
	mu.Lock()
	defer mu.Unlock()
	txs := map[int64]bool{}
	for _, xid := range txOf {
		txs[xid] = true
	}
	require.Less(t, len(txs), 8, "8 calls returned together, recorded in %d transactions", len(txs))
}

// One outcome whose Record fails does not hold back those recorded with
// it: they are recorded alone and end; it is retried.
func TestAFailingRecordDoesNotHoldItsBatchBack(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 8)
	var calls atomic.Int32
	var mu sync.Mutex
	callsOf := map[string]int{}
	release, pause := together(8, "k3"), slowFirst() // k3 is recorded in company
	start(t, effect.Config[string]{Pool: pool, Workers: 8, Lease: time.Minute,
		Do: func(ctx context.Context, e effect.Effect) (string, error) {
			mu.Lock()
			callsOf[e.Key]++
			mu.Unlock()
			if calls.Add(1) <= 8 {
				return release(ctx, e)
			}
			return "charged " + e.Key, nil
		},
		Record: func(ctx context.Context, tx pgx.Tx, e effect.Effect, result string, err error) error {
			pause()
			if e.Key == "k3" {
				return errors.New("k3's order is locked")
			}
			return record(ctx, tx, e, result, err)
		}})
	require.Eventually(t, func() bool {
		s, err := effect.ReadStats(context.Background(), pool, "charge")
		return err == nil && s.Done == 7
	}, 10*time.Second, 10*time.Millisecond, "the 7 good outcomes must be recorded")
	require.Eventually(t, func() bool { // k3's retry is scheduled by its own goroutine
		var lastErr *string
		err := pool.QueryRow(context.Background(), `SELECT last_error FROM effects WHERE key = 'k3' AND state = 'pending'`).Scan(&lastErr)
		return err == nil && lastErr != nil && strings.Contains(*lastErr, "k3's order is locked")
	}, 10*time.Second, 10*time.Millisecond, "k3 must stay pending, its last_error saying why")
	s, err := effect.ReadStats(context.Background(), pool, "charge")
	require.NoError(t, err)
	require.Equal(t, 1, s.Pending)
	mu.Lock()
	defer mu.Unlock()
	for k, n := range callsOf {
		if k != "k3" {
			require.Equal(t, 1, n, "%s was called again: its outcome waited for k3's", k)
		}
	}
}

// RecordBatch gets the outcomes that share a transaction in one call, each
// once, in id order; a failing call is repeated with each outcome alone. A
// Runner takes exactly one of Record and RecordBatch.
func TestRecordBatch(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 8)
	var mu sync.Mutex
	var sizes []int
	var calls atomic.Int32
	var misordered atomic.Bool
	release, pause := together(8, "k5"), slowFirst() // k5 is recorded in company
	start(t, effect.Config[string]{Pool: pool, Workers: 8, Lease: time.Minute,
		Do: func(ctx context.Context, e effect.Effect) (string, error) {
			if calls.Add(1) <= 8 {
				return release(ctx, e)
			}
			return "charged " + e.Key, nil
		},
	}, func(cfg *effect.Config[string]) {
		cfg.Record = nil
		cfg.RecordBatch = func(ctx context.Context, tx pgx.Tx, outcomes []effect.Outcome[string]) error {
			pause()
			mu.Lock()
			sizes = append(sizes, len(outcomes))
			mu.Unlock()
			for i, o := range outcomes {
				if i > 0 && o.Effect.ID <= outcomes[i-1].Effect.ID {
					misordered.Store(true)
				}
				if o.Effect.Key == "k5" && len(outcomes) > 1 {
					return errors.New("k5 fails in company")
				}
				if err := record(ctx, tx, o.Effect, o.Result, o.Err); err != nil {
					return err
				}
			}
			return nil
		}
	})
	got := waitEnded(t, pool)
	require.Len(t, got, 8)
	for k, v := range got {
		require.Len(t, v, 1, "%s recorded %d times", k, len(v))
	}
	require.Equal(t, int32(8), calls.Load(), "an outcome was called again: a failed batch must be recorded one by one")
	require.False(t, misordered.Load(), "RecordBatch got outcomes out of id order")
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, slices.Max(sizes), 1, "8 calls returned together, RecordBatch got them one at a time: %v", sizes)

	for _, cfg := range []effect.Config[string]{
		{Pool: pool, Kind: "charge", Do: together(1)},
		{Pool: pool, Kind: "charge", Do: together(1), Record: record,
			RecordBatch: func(context.Context, pgx.Tx, []effect.Outcome[string]) error { return nil }},
	} {
		_, err := effect.NewRunner(cfg)
		require.ErrorContains(t, err, "one of Config.Record and Config.RecordBatch")
	}
}

// An effect older than MaxAge is not called again: the outside system may
// have forgotten its key. It ends failed with ErrTooOld.
func TestMaxAge(t *testing.T) {
	pool := newPool(t)
	enqueue(t, pool, 1)
	_, err := pool.Exec(context.Background(), `UPDATE effects SET created_at = now() - interval '25 hours'`)
	require.NoError(t, err)
	var calls atomic.Int32
	start(t, effect.Config[string]{Pool: pool, MaxAge: 23 * time.Hour,
		Do: func(context.Context, effect.Effect) (string, error) { calls.Add(1); return "charged", nil }})
	got := waitEnded(t, pool)
	require.Len(t, got["k0"], 1)
	require.Contains(t, got["k0"][0], "older than MaxAge")
	require.Zero(t, calls.Load())
}

// TestRunnerRunsOnce: as inbox.Inbox and outbox.Relay, a Runner runs once
// at a time: a second Run while the first runs is refused with ErrRunning,
// and Running says whether one runs.
func TestRunnerRunsOnce(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	cfg := effect.Config[string]{Pool: pool, Kind: "charge", Record: record,
		Do: func(context.Context, effect.Effect) (string, error) { return "ok", nil }}
	r, err := effect.NewRunner(cfg)
	require.NoError(t, err)
	require.False(t, r.Running())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Running, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, r.Run(t.Context()), effect.ErrRunning, "a second Run must be refused while the first runs")
	require.True(t, r.Running(), "the refused call leaves the first running")
	cancel()
	require.NoError(t, <-done)
	require.False(t, r.Running())
}

// A runner that started on an empty effects table, as a new service's does,
// reads a few rows of it for each claim and each record once the table holds
// a history and a backlog, with no ANALYZE since: a claim reads the due
// effects in the index's order and stops at its limit, a record looks its
// ids up one by one. Before, the record kept the plan prepared while the
// table was empty (a hash join over every pending effect, for every batch)
// and each claim sorted every due effect to take a few.
func TestClaimsAndRecordsStayCheapAsTheTableGrows(t *testing.T) {
	ctx := t.Context()
	base := newPool(t)
	_, err := base.Exec(ctx, `ALTER TABLE effects SET (autovacuum_enabled = off)`) // no ANALYZE replans behind the test
	require.NoError(t, err)
	// One session: each statement is prepared once, and its sixth run on
	// the empty table may settle on a generic plan, as a service's does.
	pool, plans := pgtest.Explained(t, base, func(c *pgxpool.Config) { c.MaxConns = 1 })
	start(t, effect.Config[string]{Pool: pool,
		Do: func(_ context.Context, e effect.Effect) (string, error) {
			if e.Attempt == 1 {
				return "", errors.New("declined once") // every effect is retried once
			}
			return "ok", nil
		}})
	// One at a time on the empty table, then on a few rows with the
	// statistics autovacuum's first ANALYZE leaves: claims and records of
	// one, retries of one.
	for i := range 10 {
		if i == 2 {
			_, err := base.Exec(ctx, `ANALYZE effects`)
			require.NoError(t, err)
		}
		require.NoError(t, pgx.BeginFunc(ctx, base, func(tx pgx.Tx) error {
			_, err := effect.EnqueueTx(ctx, tx, "charge", fmt.Sprintf("first%d", i), []byte("x"))
			return err
		}))
		waitEnded(t, base)
	}
	_, err = base.Exec(ctx, `INSERT INTO effects (kind, key, payload, state, done_at)
		SELECT 'charge', 'old' || g, '\x00', 'done', now() FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	plans.Take()
	_, err = base.Exec(ctx, `INSERT INTO effects (kind, key, payload) SELECT 'charge', 'due' || g, '\x00' FROM generate_series(1, 2000) g`)
	require.NoError(t, err)
	waitNonePending(t, base, 20*time.Second)

	ran := plans.Take()
	claims, records, retries := 0, 0, 0
	for _, p := range ran {
		switch {
		case strings.Contains(p.Query, "SET attempts"):
			claims++
		case strings.Contains(p.Query, "SET state"):
			records++
		case strings.Contains(p.Query, "SET due_at"):
			retries++
		}
	}
	require.Empty(t, pgtest.Costly(ran, 100, "effects"), "statements that read more than 100 rows of effects (20,000 ended, 2,000 due) for a few effects")
	require.GreaterOrEqual(t, claims, 2000/effect.DefaultWorkers, "the claims of 2,000 effects were not all explained")
	require.GreaterOrEqual(t, records, 2000/effect.DefaultWorkers, "the records of 2,000 effects were not all explained")
	require.GreaterOrEqual(t, retries, 2000, "the retries of 2,000 effects were not all explained") // more if a record failed
}

func (w *world) callCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}
