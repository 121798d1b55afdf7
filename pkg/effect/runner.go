package effect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// Defaults of Config.
const (
	DefaultWorkers      = 4
	DefaultLease        = 30 * time.Second
	DefaultPollInterval = 200 * time.Millisecond
	DefaultMinBackoff   = 200 * time.Millisecond
	DefaultMaxBackoff   = time.Minute
)

// Config configures a Runner of one kind of effect, whose outcome is an R.
type Config[R any] struct {
	// Pool is the database that holds the effects table. Required.
	Pool *pgxpool.Pool
	// Kind is the kind of effect this runner performs. Required.
	Kind string
	// Do performs the effect once and returns its outcome. It must send
	// e.Key to the outside system as the idempotency key: Do is called
	// again after any failure, after a crash between the call and the
	// record, and, rarely, beside a runner that outlived its lease, and
	// only the key makes those calls one effect. An error wrapped with
	// Permanent ends the effect (Record gets it); any other is retried
	// with backoff. A decline the outside system answers for good (a card
	// declined) is an outcome, not an error. Required.
	Do func(ctx context.Context, e Effect) (R, error)
	// Record applies the outcome to the domain in tx, the transaction that
	// marks the effect done (or failed, when err is Do's permanent error):
	// the outcome is recorded once, with the effect's end. Outcomes whose
	// calls returned together share tx, one Record call each; when one
	// Record fails, each is recorded again in a transaction of its own, so
	// Record must write only what its own effect changes. Record or
	// RecordBatch is required.
	Record func(ctx context.Context, tx pgx.Tx, e Effect, result R, err error) error
	// RecordBatch, instead of Record, applies the outcomes that share tx
	// in one call, so that it can write them set-based (one UPDATE for all,
	// one outbox.PublishTx): it gets the outcomes of the effects tx ends,
	// in id order. When it fails, it is called again with each outcome
	// alone, in a transaction of its own.
	RecordBatch func(ctx context.Context, tx pgx.Tx, outcomes []Outcome[R]) error

	// Workers is how many calls run at once. Defaults to DefaultWorkers.
	Workers int
	// Lease is how long a claimed effect stays with its runner: a runner
	// that dies mid-call leaves the effect to another after it. Each call
	// gets Lease/2 (the context's deadline). Defaults to DefaultLease.
	Lease time.Duration
	// PollInterval is how often the runner looks for due effects when it
	// found none. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// MinBackoff is the wait after the first failed call; it doubles after
	// each further one, with jitter, up to MaxBackoff. Defaults to
	// DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// MaxAge, when set, ends an effect older than this as failed instead
	// of calling it (ErrTooOld, handed to Record): set it below the time
	// the outside system remembers a key (Stripe: 24 hours), after which a
	// repeated call would be performed again. 0: no limit.
	MaxAge time.Duration
	// Standby, on a Postgres that replicates asynchronously, holds each
	// claim's calls until the standbys a failover would promote hold the
	// effects it claimed (see package standby). Nil: called once claimed
	// (one node, or synchronous replication).
	Standby *standby.Gate
	// Logger receives what goes wrong (and, at Info, what an operator
	// wants to know, like a call retried). Defaults to discarding it.
	Logger *slog.Logger
	// log is Logger, or a logger that discards.
	log *slog.Logger
}

// ErrTooOld is the error Record gets for an effect older than MaxAge.
var ErrTooOld = errors.New("effect: older than MaxAge: the outside system may have forgotten its key, so it is not called again")

// Runner performs the effects of one kind that transactions recorded with
// EnqueueTx: it claims each due effect, calls Do with its key, and records
// the outcome with Record (or RecordBatch) in the transaction that ends the
// effect. One recorder records, one transaction at a time: the outcomes
// that return while one commits share the next.
// Replicas may run one each: a claim takes each effect for one runner.
type Runner[R any] struct {
	cfg Config[R]

	mu      sync.Mutex
	stats   RunnerStats
	running atomic.Bool // Run was called and has not returned
}

// ErrRunning is returned by Run when the Runner is already running (as
// inbox.ErrRunning and outbox.ErrRunning are by theirs).
var ErrRunning = errors.New("effect: Runner.Run is already running")

// Running reports whether Run is running: for a readiness check.
func (r *Runner[R]) Running() bool { return r.running.Load() }

// RunnerStats counts what one Runner did since it started.
type RunnerStats struct {
	Calls    int64 `json:"calls"`
	Done     int64 `json:"done"`
	Failed   int64 `json:"failed"`
	Retried  int64 `json:"retried"`
	Overtook int64 `json:"overtook"` // outcomes another runner recorded first
}

// NewRunner checks cfg and returns a Runner.
func NewRunner[R any](cfg Config[R]) (*Runner[R], error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("effect: Config.Pool is required")
	case cfg.Kind == "":
		return nil, errors.New("effect: Config.Kind is required")
	case cfg.Do == nil || (cfg.Record == nil) == (cfg.RecordBatch == nil):
		return nil, errors.New("effect: Config.Do and one of Config.Record and Config.RecordBatch are required")
	case cfg.Workers < 0 || cfg.Lease < 0 || cfg.PollInterval < 0 || cfg.MinBackoff < 0 || cfg.MaxBackoff < 0 || cfg.MaxAge < 0:
		return nil, errors.New("effect: Config's counts and durations must not be negative")
	}
	cfg.Workers = cmp.Or(cfg.Workers, DefaultWorkers)
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	cfg.MinBackoff = cmp.Or(cfg.MinBackoff, DefaultMinBackoff)
	cfg.MaxBackoff = max(cmp.Or(cfg.MaxBackoff, DefaultMaxBackoff), cfg.MinBackoff)
	cfg.log = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return &Runner[R]{cfg: cfg}, nil
}

// Stats returns what the runner did since it started.
func (r *Runner[R]) Stats() RunnerStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

func (r *Runner[R]) count(f func(*RunnerStats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// Run performs due effects until ctx ends, then waits for the calls in
// flight to be recorded (each within its deadline) and returns nil. It is
// an error (ErrRunning) to call Run while it runs.
func (r *Runner[R]) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	slots := make(chan struct{}, r.cfg.Workers)
	var wg sync.WaitGroup
	// Calls in flight finish and record after ctx ends: a shutdown does
	// not abandon a call the outside world may already have performed.
	work := context.WithoutCancel(ctx)
	// One recorder ends the effects whose calls returned, together: the
	// outcomes that arrive while a record commits share the next one.
	outcomes := make(chan outcome[R])
	recorded := make(chan struct{})
	go func() { defer close(recorded); r.recorder(work, outcomes) }()
	defer func() { wg.Wait(); close(outcomes); <-recorded }()
	wait := time.Duration(0)
	failing := 0 // claims failed in a row
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		free := 0
	fill:
		for free < r.cfg.Workers {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break fill
			}
		}
		if free == 0 {
			wait = 10 * time.Millisecond
			continue
		}
		// The claim itself is not cancelled: one that commits as ctx ends
		// would leave its effects leased and uncalled for a whole lease.
		claimCtx, cancelClaim := context.WithTimeout(work, r.cfg.Lease/2)
		effects, err := r.claim(claimCtx, free)
		cancelClaim()
		for range free - len(effects) {
			<-slots
		}
		if err != nil {
			// One line when the database stops answering, not one a poll.
			if failing++; failing == 1 && ctx.Err() == nil {
				r.cfg.log.Error("effect: claiming failed; retrying every poll", "error", err, "kind", r.cfg.Kind)
			}
			wait = r.cfg.PollInterval
			continue
		}
		if failing > 0 {
			r.cfg.log.Info("effect: claiming works again", "kind", r.cfg.Kind, "failed_polls", failing)
			failing = 0
		}
		for _, e := range effects {
			wg.Add(1)
			go func() {
				defer func() { <-slots; wg.Done() }()
				r.perform(work, e, outcomes)
			}()
		}
		wait = 0
		if len(effects) < free {
			wait = r.cfg.PollInterval
		}
	}
}

// claim takes up to n due effects for this runner: each stays with it for
// the lease (its due_at moves past the lease) and counts an attempt. The
// claim commits before any call, so no transaction stays open across a
// call to the outside world. It reads effects_due in its order and stops
// at n: ordered by anything the index does not hold (due_at, id), it
// sorted every due effect on every claim, and a backlog of them made each
// claim slower (1.7 ms at 10,000 orders in the benchmark). The rows it
// took are then found by their ids (= ANY of an array: a look-up per id,
// whatever the statistics say), planned per call (planEachTime). As a
// join of effects to the ids, planned with the statistics of a table that
// held a few rows, it became a merge join that walked the primary key from
// the first effect ever made to the newest due one: every claim read the
// whole table.
//
// With Config.Standby the claim is marked, and returns once the standbys a
// failover would promote hold the effects it took: no call goes out for an
// effect a failover can take back (the outside world would keep a capture
// of an order that, after the failover, was never paid).
func (r *Runner[R]) claim(ctx context.Context, n int) ([]Effect, error) {
	if r.cfg.Standby == nil {
		return r.claimIn(ctx, r.cfg.Pool, n)
	}
	var effects []Effect
	var ticket standby.Ticket
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) (err error) {
		if effects, err = r.claimIn(ctx, tx, n); err != nil || len(effects) == 0 {
			return err
		}
		ticket, err = r.cfg.Standby.Mark(ctx, tx)
		return err
	})
	if err != nil || len(effects) == 0 {
		return nil, err
	}
	// An effect claimed and not released waits out its lease, like one
	// whose runner died.
	if err := r.cfg.Standby.Wait(ctx, ticket); err != nil {
		return nil, fmt.Errorf("effect: %w", err)
	}
	return effects, nil
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (r *Runner[R]) claimIn(ctx context.Context, q querier, n int) ([]Effect, error) {
	rows, err := q.Query(ctx, `
		UPDATE effects SET attempts = attempts + 1, due_at = now() + $3::interval
		WHERE id = ANY(ARRAY(
		      SELECT id FROM effects
		      WHERE kind = $1 AND state = 'pending' AND due_at <= now()
		      ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED))
		RETURNING id, key, payload, attempts, created_at`, planEachTime, r.cfg.Kind, n, r.cfg.Lease)
	if err != nil {
		return nil, err
	}
	effects, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Effect, error) {
		e := Effect{Kind: r.cfg.Kind}
		return e, row.Scan(&e.ID, &e.Key, &e.Payload, &e.Attempt, &e.Created)
	})
	if err != nil {
		return nil, err
	}
	return effects, nil
}

// perform calls the effect and has the recorder record its outcome, or
// schedules a retry. The two named crash windows sit on either side of the
// call.
func (r *Runner[R]) perform(ctx context.Context, e Effect, outcomes chan<- outcome[R]) {
	r.count(func(s *RunnerStats) { s.Calls++ })
	fields := []any{"kind", e.Kind, "key", e.Key, "attempt", e.Attempt}
	var result R
	var err error
	if r.cfg.MaxAge > 0 && time.Since(e.Created) > r.cfg.MaxAge {
		err = Permanent(ErrTooOld)
	} else {
		failpoint.Hit(failpoint.BeforeEffect, e.Key) // intent committed, call not made
		callCtx, cancel := context.WithTimeout(ctx, r.cfg.Lease/2)
		result, err = r.cfg.Do(callCtx, e)
		cancel()
		if err != nil && !IsPermanent(err) {
			r.retryLater(ctx, e, err, fields)
			return
		}
		if err == nil {
			failpoint.Hit(failpoint.AfterEffectBeforeRecord, e.Key) // performed, outcome not recorded
		}
	}
	o := outcome[R]{e: e, result: result, err: err, done: make(chan recordedAs, 1)}
	outcomes <- o
	as := <-o.done
	recorded, rerr := as.recorded, as.err
	switch {
	case rerr != nil:
		// The effect stays pending and is called again after the backoff;
		// the key makes that call return this outcome. last_error shows
		// why, and effects_retrying counts it.
		r.retryLater(ctx, e, fmt.Errorf("recording the outcome: %w", rerr), fields)
	case !recorded:
		r.count(func(s *RunnerStats) { s.Overtook++ })
		r.cfg.log.Info("effect: another runner recorded this effect first", fields...)
	case err != nil:
		r.count(func(s *RunnerStats) { s.Failed++ })
		r.cfg.log.Error("effect: failed for good", append(fields, "error", err)...)
	default:
		r.count(func(s *RunnerStats) { s.Done++ })
		r.cfg.log.Debug("effect: done", fields...)
	}
}

// recordError is an error of Record or RecordBatch, as opposed to one of
// the database or the deadline.
type recordError struct{ err error }

func (e recordError) Error() string { return "record: " + e.err.Error() }
func (e recordError) Unwrap() error { return e.err }

// Outcome is one call's result as RecordBatch gets it: Err is Do's
// permanent error (the effect ends failed), or nil.
type Outcome[R any] struct {
	Effect Effect
	Result R
	Err    error
}

// outcome is a call's result on its way to the recorder, which answers on
// done.
type outcome[R any] struct {
	e      Effect
	result R
	err    error // Do's permanent error, or nil
	done   chan recordedAs
}

// recordedAs is what became of an outcome: recorded, or not because
// another runner ended the effect first, or err.
type recordedAs struct {
	recorded bool
	err      error
}

// recorder records the outcomes sent to it until the channel closes. It
// takes every outcome already waiting (up to Workers, the calls that can
// be in flight) into one transaction: under load the calls that returned
// while the last record committed share the next, one BEGIN, one UPDATE of
// the effects and one COMMIT for all of them.
func (r *Runner[R]) recorder(ctx context.Context, outcomes <-chan outcome[R]) {
	for first := range outcomes {
		batch := []outcome[R]{first}
	waiting:
		for len(batch) < r.cfg.Workers {
			select {
			case o, ok := <-outcomes:
				if !ok {
					break waiting
				}
				batch = append(batch, o)
			default:
				break waiting
			}
		}
		// In id order, so two runners' batches (after an expired lease)
		// take the rows' locks in one order. An effect this runner claimed
		// again after its own lease expired can be here twice: the first
		// outcome is recorded, the other is not (as if another runner had
		// recorded first).
		slices.SortStableFunc(batch, func(a, b outcome[R]) int { return cmp.Compare(a.e.ID, b.e.ID) })
		unique := batch[:0:0]
		for _, o := range batch {
			if len(unique) > 0 && unique[len(unique)-1].e.ID == o.e.ID {
				o.done <- recordedAs{}
				continue
			}
			unique = append(unique, o)
		}
		r.recordBatch(ctx, unique)
	}
}

// recordBatch records batch in one transaction and answers each outcome.
// When Record (or RecordBatch) fails it and it holds more than one, each is
// recorded alone: one outcome whose Record fails does not hold the others
// back. Any other failure (the database, the deadline) is every outcome's.
func (r *Runner[R]) recordBatch(ctx context.Context, batch []outcome[R]) {
	recordCtx, cancel := context.WithTimeout(ctx, r.cfg.Lease/2)
	recorded, err := r.record(recordCtx, batch)
	timedOut := recordCtx.Err() != nil
	cancel()
	var domain recordError
	if err != nil && len(batch) > 1 && errors.As(err, &domain) && !timedOut {
		for _, o := range batch {
			r.recordBatch(ctx, []outcome[R]{o})
		}
		return
	}
	for i, o := range batch {
		o.done <- recordedAs{recorded: recorded[i], err: err}
	}
}

// planEachTime, passed before a statement's arguments, has Postgres plan it
// for the arguments it gets and the table as it is (pgx's unnamed
// statement, in the same round trip) instead of reusing a prepared
// statement's generic plan. A generic plan made while effects held a few
// rows, as it does when a service starts, reads every pending effect (or
// the whole table) for each batch or retry until the next ANALYZE replans
// it. Planned per call, a statement still sees the statistics of those few
// rows, which may say no effect is pending: so the statements that claim,
// end or reschedule effects find them by their ids (= ANY, or =: a look-up
// per id whatever the statistics say), and those that find a pending
// effect by its id say so as "not ended" (NOT IN ('done', 'failed'), the
// two other states of the table's CHECK: a state added there is added
// here): written as state = 'pending', it lets Postgres read effects_due,
// whose predicate it is, believing it holds one row, and filter every
// pending effect for the id (TestClaimsAndRecordsStayCheapAsTheTableGrows).
var planEachTime = pgx.QueryExecModeExec

// record ends the batch's effects and applies their outcomes in one
// transaction. An effect already ended (another runner, whose claim
// followed an expired lease of this one, recorded it first) is not
// recorded: its entry in the result is false.
func (r *Runner[R]) record(ctx context.Context, batch []outcome[R]) ([]bool, error) {
	ids := make([]int64, len(batch))
	states := make([]string, len(batch))
	lastErrs := make([]*string, len(batch))
	for i, o := range batch {
		ids[i], states[i] = o.e.ID, "done"
		if o.err != nil {
			msg := o.err.Error()
			states[i], lastErrs[i] = "failed", &msg
		}
	}
	recorded := make([]bool, len(batch))
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE effects e SET state = u.state, last_error = u.last_error, done_at = now()
			FROM unnest($1::bigint[], $2::text[], $3::text[]) AS u(id, state, last_error)
			WHERE e.id = u.id AND e.id = ANY($1) AND e.state NOT IN ('done', 'failed')
			RETURNING e.id`, planEachTime, ids, states, lastErrs)
		if err != nil {
			return err
		}
		ended, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		ours := make(map[int64]bool, len(ended))
		for _, id := range ended {
			ours[id] = true
		}
		var all []Outcome[R]
		for i, o := range batch {
			if !ours[o.e.ID] {
				continue
			}
			delete(ours, o.e.ID) // an effect twice in a batch records once
			recorded[i] = true
			if r.cfg.RecordBatch != nil {
				all = append(all, Outcome[R]{Effect: o.e, Result: o.result, Err: o.err})
			} else if err := r.cfg.Record(ctx, tx, o.e, o.result, o.err); err != nil {
				return recordError{err}
			}
		}
		if len(all) > 0 {
			if err := r.cfg.RecordBatch(ctx, tx, all); err != nil {
				return recordError{err}
			}
		}
		return nil
	})
	if err != nil {
		return make([]bool, len(batch)), err
	}
	return recorded, nil
}

// retryLater makes the effect due again after the backoff for its attempt,
// unless another runner claimed it since (its lease expired under this
// one): attempts is the claim's fencing token, so a late runner cannot cut
// short the lease of the one calling now.
func (r *Runner[R]) retryLater(ctx context.Context, e Effect, callErr error, fields []any) {
	r.count(func(s *RunnerStats) { s.Retried++ })
	wait := r.backoff(e.Attempt)
	r.cfg.log.Info("effect: call failed; retrying", append(fields, "error", callErr, "retry_in", wait.String())...)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Lease/2)
	defer cancel()
	if _, err := r.cfg.Pool.Exec(ctx, `UPDATE effects SET due_at = now() + $2::interval, last_error = $3
		WHERE id = $1 AND state NOT IN ('done', 'failed') AND attempts = $4`, planEachTime, e.ID, wait, callErr.Error(), e.Attempt); err != nil {
		r.cfg.log.Error("effect: scheduling the retry failed; the call is repeated after the lease", append(fields, "error", err)...)
	}
}

// backoff is MinBackoff doubled per earlier attempt, capped at MaxBackoff,
// with up to a quarter of jitter so runners that failed together do not
// call again together.
func (r *Runner[R]) backoff(attempt int) time.Duration {
	d := r.cfg.MinBackoff
	for i := 1; i < attempt && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.cfg.MaxBackoff)
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}
