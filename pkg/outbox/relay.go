package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
)

// After a batch with rows, the relay polls relayFollowUps more times,
// relayFollowUpInterval apart, before it waits for a notification again.
const (
	relayFollowUps        = 5
	relayFollowUpInterval = 5 * time.Millisecond
)

// RelayStats counts what a Relay did since it started.
type RelayStats struct {
	Published int64 // messages the broker acknowledged and the relay marked
	Batches   int64 // committed batches
	Errors    int64 // failed batches (their rows are retried)
	Parked    int64 // rows parked because the broker will never take them
	Deleted   int64 // published rows removed by retention
	Shards    int   // shards this relay owns now (RelayConfig.Shards > 1)
}

// Relay publishes committed outbox rows at least once.
type Relay struct {
	cfg     RelayConfig
	claimTx pgx.TxOptions // see txOptions
	wake    chan struct{}
	stats   struct{ published, batches, errors, parked, deleted atomic.Int64 }

	// Sharded relays (shard.go).
	leases                    leases
	claimShards, pendingShard string     // the statements for cfg.Shards
	batchMu                   sync.Mutex // one batch at a time per sharded relay: its leases do not exclude its own batches

	running atomic.Bool // Run was called and has not returned
}

// ErrRunning is returned by Run when the Relay is already running (as
// inbox.ErrRunning and effect.ErrRunning are by theirs).
var ErrRunning = errors.New("outbox: Relay.Run is already running")

// Running reports whether Run is running: for a readiness check, or a test
// that must not commit before the relay listens.
func (r *Relay) Running() bool { return r.running.Load() }

// NewRelay checks cfg and returns a relay; Run starts it.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, wake: make(chan struct{}, 1)}
	r.claimTx = r.txOptions()
	if cfg.Shards > 1 {
		r.claimShards, r.pendingShard = claimShardsSQL(cfg.Shards), pendingShardsSQL(cfg.Shards)
	}
	return r, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Published: r.stats.published.Load(),
		Batches:   r.stats.batches.Load(),
		Errors:    r.stats.errors.Load(),
		Parked:    r.stats.parked.Load(),
		Deleted:   r.stats.deleted.Load(),
		Shards:    r.leases.count(),
	}
}

// Run publishes rows until ctx ends, then finishes the batch in flight and
// returns nil. It also runs the listener and the retention job. It is an
// error (ErrRunning) to call Run while it runs.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)
	if err := r.checkTable(ctx); err != nil {
		return err
	}
	if r.cfg.Shards > 1 {
		// A first round before the first batch, then every LeaseTTL/3; when
		// ctx ends the leases are given back, each once the batch in flight
		// on it committed (the batch holds it FOR SHARE).
		if err := r.leaseRound(ctx); errors.Is(err, ErrShardCount) {
			return err // a relay that disagrees on the count must not run
		} else if err != nil && ctx.Err() == nil {
			r.cfg.log.Error("Relay lease round failed; retrying", err, watermill.LogFields{"relay": r.cfg.RelayID})
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.listen(ctx) }()
	go func() { defer wg.Done(); r.retain(ctx) }()
	defer wg.Wait()
	if r.cfg.Shards > 1 {
		wg.Add(1)
		go func() { defer wg.Done(); r.lease(ctx) }()
	}
	r.loop(ctx)
	return nil
}

// loop relays batches until ctx ends: at once while batches come full,
// woken by a producer's notification, after a few short follow-up polls
// once rows arrived, by the regular poll otherwise, and after a backoff
// once a batch failed.
func (r *Relay) loop(ctx context.Context) {
	poll := time.NewTimer(0)
	defer poll.Stop()
	followUps := 0
	failures := 0   // failed batches in a row
	polled := false // woken by the timer, not by a notification or a full batch
	for {
		n, err := r.relayIfPending(ctx, polled)
		// After rows arrived, look again a few times at short intervals:
		// producers that commit while another one's notification is being
		// consumed do not notify (see PublishTx), and their rows must not
		// wait for the regular poll.
		if n > 0 {
			followUps = relayFollowUps
		} else if followUps > 0 {
			followUps--
		}
		switch {
		case err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled):
			return // shutting down during the pending check
		case err != nil:
			failures++
			r.stats.errors.Add(1)
			wait := r.backoff(failures)
			r.cfg.log.Error("Relay batch failed; rows will be retried", err,
				watermill.LogFields{"failures_in_a_row": failures, "retry_in": wait.String()})
			if !ctxtime.Sleep(ctx, wait) {
				return
			}
			continue
		case n == r.cfg.BatchSize:
			failures = 0
			if ctx.Err() != nil {
				return
			}
			polled = false
			continue // more rows are likely waiting
		}
		failures = 0
		wait := r.cfg.PollInterval
		if followUps > 0 {
			wait = min(wait, relayFollowUpInterval)
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
			polled = false
		case <-poll.C:
			polled = true
		}
	}
}

// checkTable refuses, before the first batch, a table the relay must not
// run on: an id sequence that caches ids (checkIDSequence), Partitions on a
// plain table (checkPartitioned). While Postgres does not answer it asks
// again, with the batches' backoff, so a relay that starts before its
// database is checked all the same. It returns nil when ctx ends.
func (r *Relay) checkTable(ctx context.Context) error {
	for failures := 1; ; failures++ {
		refused, err := r.checkIDSequence(ctx)
		if refused == nil && err == nil {
			refused, err = r.checkPartitioned(ctx)
		}
		switch {
		case refused != nil:
			return refused
		case err == nil || ctx.Err() != nil:
			return nil
		}
		wait := r.backoff(failures)
		r.cfg.log.Error("Outbox table not checked yet; asking again", err, watermill.LogFields{"retry_in": wait.String()})
		if !ctxtime.Sleep(ctx, wait) {
			return nil
		}
	}
}

// backoff is the wait after the failures-th failed batch in a row:
// ErrorBackoff doubled for each earlier failure, up to MaxErrorBackoff. A
// broker that is down is not asked again every ErrorBackoff, with the whole
// batch, for as long as it stays down.
func (r *Relay) backoff(failures int) time.Duration {
	wait := r.cfg.ErrorBackoff
	for i := 1; i < failures && wait < r.cfg.MaxErrorBackoff; i++ {
		wait *= 2
	}
	return min(wait, r.cfg.MaxErrorBackoff)
}

// relayIfPending runs a batch, first checking, when the relay was woken by
// its timer, that a row is waiting at all. Most polls find nothing (the
// follow-ups after every batch, in particular), and the check is one round
// trip outside any transaction, against the three of an empty batch. It
// returns how many rows the batch claimed.
func (r *Relay) relayIfPending(ctx context.Context, polled bool) (int, error) {
	if polled {
		query, args := pendingSQL, []any{planEachTime}
		if r.cfg.Shards > 1 {
			shards, _ := r.leases.snapshot()
			if len(shards) == 0 {
				return 0, nil
			}
			query, args = r.pendingShard, append(args, shards)
		}
		var pending bool
		if err := r.cfg.Pool.QueryRow(ctx, query, args...).Scan(&pending); err != nil {
			return 0, fmt.Errorf("looking for rows: %w", err)
		}
		if !pending {
			return 0, nil
		}
	}
	res, err := r.relayOnce(ctx)
	return res.claimed, err
}

// sendable is the condition, on outbox_messages m, of a row the relay may
// claim: unpublished, not parked, and not waiting behind a parked row of its
// key (see Parked).
const sendable = `m.published_at IS NULL AND m.parked_at IS NULL
		AND NOT EXISTS (
			SELECT FROM outbox_messages p
			WHERE p.parked_at IS NOT NULL AND p.topic = m.topic
			  AND p.partition_key = m.partition_key AND p.partition_key <> '' AND p.id < m.id)`

// pendingSQL reports whether any row waits to be claimed, through the
// pending index.

const pendingSQL = `SELECT EXISTS (SELECT FROM outbox_messages m WHERE ` + sendable + `)`

// RelayOnce claims up to BatchSize unpublished rows, publishes them, and marks
// them published, all in one transaction. It returns how many it published.
// The claim marks the rows in the same statement that locks them, so a batch
// costs three round trips to Postgres (begin, claim, commit) besides the
// broker's; the mark only counts once the transaction commits, after the
// broker acknowledged every row. The rows stay locked until then, so no other
// relay takes them; if anything fails before the commit, the rows are
// released unmarked and published again later: at least once.
//
// A row the broker refuses for good is parked instead (see Parked), and the
// rest of the batch is published: one bad row cannot stop the outbox.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	if r.cfg.Shards > 1 && !r.leases.started() {
		if err := r.leaseRound(ctx); err != nil { // a relay not Run takes its shards once
			return 0, err
		}
	}
	res, err := r.relayOnce(ctx)
	return res.published, err
}

func (r *Relay) relayOnce(ctx context.Context) (sent, error) {
	if r.cfg.Shards > 1 {
		// A shard's FOR SHARE and the shared relay lock do not exclude a
		// second batch of this same relay (RelayOnce beside Run).
		r.batchMu.Lock()
		defer r.batchMu.Unlock()
	}
	// Finish a started batch even if ctx ends: abandoning it would only mean
	// publishing it twice.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()

	var res sent
	err := pgx.BeginTxFunc(ctx, r.cfg.Pool, r.claimTx, func(tx pgx.Tx) error {
		batch, err := r.claim(ctx, tx)
		if err != nil || len(batch) == 0 {
			return err
		}
		failpoint.Hit(failpoint.AfterClaimBeforePublish, batch[0].msgID)
		if err := r.heldByStandbys(ctx, tx); err != nil {
			return err
		}

		res = r.send(batch)
		if res.err != nil && res.published == 0 && len(res.parked) == 0 {
			return res.err // nothing to keep: roll the claim back
		}
		if err := r.unclaim(ctx, tx, res); err != nil {
			return err
		}
		if res.published > 0 {
			failpoint.Hit(failpoint.AfterPublishBeforeMark, batch[0].msgID)
		}
		return nil // the commit makes the claim's mark count
	})
	if err != nil {
		return sent{}, err
	}
	if res.published > 0 {
		r.stats.published.Add(int64(res.published))
		r.stats.batches.Add(1)
	}
	for _, p := range res.parked {
		r.stats.parked.Add(1)
		r.cfg.log.Error("Relay parked an outbox row the broker will not take; its key waits until it is retried or dropped",
			errors.New(p.reason), watermill.LogFields{"row": p.id, "message_id": p.msgID, "topic": p.topic, "key": p.key})
	}
	return res, res.err
}

// heldByStandbys waits, with RelayConfig.Standby, until the primary's
// standbys hold the rows the batch claimed in tx (they committed before the
// claim): an event leaves only once a failover cannot take its cause back.
func (r *Relay) heldByStandbys(ctx context.Context, tx pgx.Tx) error {
	ticket, err := r.cfg.Standby.Mark(ctx, tx)
	if err != nil {
		return err
	}
	return r.cfg.Standby.Wait(ctx, ticket)
}

// listen holds a connection that LISTENs on its schema's NotifyChannel and
// turns each notification into a wake-up. A lost connection is
// re-established; the poll covers the gap.
func (r *Relay) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.log.Error("Outbox listener lost; falling back to polling until it reconnects", err, nil)
		// Reconnect soon even when the poll is slow: until then, commits
		// wait for the poll.
		ctxtime.Sleep(ctx, min(r.cfg.PollInterval, time.Second))
	}
}

func (r *Relay) listenOnce(ctx context.Context) error {
	conn, err := r.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// A LISTENing session must not go back to the pool.
	defer func() { conn.Hijack().Close(context.Background()) }() //nolint:errcheck
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{NotifyChannel(schema)}.Sanitize()); err != nil {
		return err
	}
	r.poke() // rows committed while nobody listened
	for {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			return err
		}
		r.poke()
	}
}

func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
