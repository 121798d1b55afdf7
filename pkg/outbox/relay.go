package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/internal/ctxtime"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// After a batch with rows, the relay polls relayFollowUps more times,
// relayFollowUpInterval apart, before it waits for a notification again.
const (
	relayFollowUps        = 5
	relayFollowUpInterval = 5 * time.Millisecond
)

// relayLockKey is the advisory lock that makes one relay at a time the
// publisher, so rows leave in id order and one key's messages keep their order.
const relayLockKey = 7_412_002

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool is the database that holds outbox_messages. Required.
	Pool *pgxpool.Pool
	// Publisher receives the rows, for example a watermill-kafka Publisher
	// built with kafka.NewWithPartitioningMarshaler(outbox.PartitionKey).
	// Publish must return only after the broker acknowledged every message.
	// Required.
	Publisher message.Publisher

	// BatchSize is how many rows one transaction claims and publishes.
	// Defaults to 500.
	BatchSize int
	// PollInterval is how often the relay looks for rows when nothing woke
	// it. A commit's notification wakes it within milliseconds; the poll
	// covers a lost listener connection and the rare row whose producer did
	// not notify because another one was notifying at that moment (see
	// PublishTx) and that committed after the relay's follow-up polls.
	// Defaults to 250ms.
	PollInterval time.Duration
	// Parallel lets several relay replicas publish at the same moment
	// (each claims rows with SKIP LOCKED). It raises throughput but gives up
	// per-key order across replicas. Defaults to false: replicas take turns
	// through an advisory lock, and a standby takes over within PollInterval
	// when the active one dies.
	Parallel bool
	// ErrorBackoff is how long the relay waits after a failed batch before it
	// tries again. Defaults to 200ms.
	ErrorBackoff time.Duration
	// BatchTimeout bounds one claim-publish-mark transaction. A batch in
	// flight when Run's context ends is finished, within this bound, so a
	// graceful shutdown does not republish it. Defaults to 30s.
	BatchTimeout time.Duration

	// Retention is how long published rows are kept before the retention job
	// deletes them. Defaults to 1h.
	Retention time.Duration
	// RetentionInterval is how often the retention job runs. Defaults to 1m.
	RetentionInterval time.Duration
	// RetentionBatch is how many rows one DELETE removes. Defaults to 5000.
	RetentionBatch int

	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *RelayConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.PollInterval == 0 {
		c.PollInterval = 250 * time.Millisecond
	}
	if c.ErrorBackoff == 0 {
		c.ErrorBackoff = 200 * time.Millisecond
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = 30 * time.Second
	}
	if c.Retention == 0 {
		c.Retention = time.Hour
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.RetentionBatch == 0 {
		c.RetentionBatch = 5000
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports the first invalid field.
func (c RelayConfig) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("outbox: RelayConfig.Pool is required")
	case c.Publisher == nil:
		return errors.New("outbox: RelayConfig.Publisher is required")
	case c.BatchSize < 1:
		return errors.New("outbox: RelayConfig.BatchSize must be positive")
	case c.PollInterval < time.Millisecond:
		return errors.New("outbox: RelayConfig.PollInterval must be at least 1ms")
	case c.Retention < 0:
		return errors.New("outbox: RelayConfig.Retention must not be negative")
	// Negative values below slip past setDefaults: a negative
	// RetentionInterval panics in time.NewTicker inside Run, a negative
	// BatchTimeout fails every batch, a negative RetentionBatch every DELETE.
	case c.ErrorBackoff < 0:
		return errors.New("outbox: RelayConfig.ErrorBackoff must not be negative")
	case c.BatchTimeout < 0:
		return errors.New("outbox: RelayConfig.BatchTimeout must be positive")
	case c.RetentionInterval < 0:
		return errors.New("outbox: RelayConfig.RetentionInterval must be positive")
	case c.RetentionBatch < 0:
		return errors.New("outbox: RelayConfig.RetentionBatch must be positive")
	}
	return nil
}

// RelayStats counts what a Relay did since it started.
type RelayStats struct {
	Published int64 // messages the broker acknowledged and the relay marked
	Batches   int64 // committed batches
	Errors    int64 // failed batches (their rows are retried)
	Deleted   int64 // published rows removed by retention
}

// Relay publishes committed outbox rows at least once.
type Relay struct {
	cfg   RelayConfig
	wake  chan struct{}
	stats struct{ published, batches, errors, deleted atomic.Int64 }
}

// NewRelay checks cfg and returns a relay; Run starts it.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, wake: make(chan struct{}, 1)}, nil
}

// Stats returns the relay's counters.
func (r *Relay) Stats() RelayStats {
	return RelayStats{
		Published: r.stats.published.Load(),
		Batches:   r.stats.batches.Load(),
		Errors:    r.stats.errors.Load(),
		Deleted:   r.stats.deleted.Load(),
	}
}

// Run publishes rows until ctx ends, then finishes the batch in flight and
// returns nil. It also runs the listener and the retention job.
func (r *Relay) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.listen(ctx) }()
	go func() { defer wg.Done(); r.retain(ctx) }()
	defer wg.Wait()

	poll := time.NewTimer(0)
	defer poll.Stop()
	followUps := 0
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
		case err != nil:
			r.stats.errors.Add(1)
			r.cfg.Logger.Error("Relay batch failed; rows will be retried", err, nil)
			if !ctxtime.Sleep(ctx, r.cfg.ErrorBackoff) {
				return nil
			}
			continue
		case n == r.cfg.BatchSize:
			if ctx.Err() != nil {
				return nil
			}
			polled = false
			continue // more rows are likely waiting
		}
		wait := r.cfg.PollInterval
		if followUps > 0 {
			wait = min(wait, relayFollowUpInterval)
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
			polled = false
		case <-poll.C:
			polled = true
		}
	}
}

// relayIfPending runs RelayOnce, first checking, when the relay was woken by
// its timer, that a row is waiting at all. Most polls find nothing (the
// follow-ups after every batch, in particular), and the check is one round
// trip outside any transaction, against the three of an empty batch.
func (r *Relay) relayIfPending(ctx context.Context, polled bool) (int, error) {
	if polled {
		var pending bool
		if err := r.cfg.Pool.QueryRow(ctx, pendingSQL, planEachTime).Scan(&pending); err != nil {
			return 0, fmt.Errorf("looking for rows: %w", err)
		}
		if !pending {
			return 0, nil
		}
	}
	return r.RelayOnce(ctx)
}

// pendingSQL reports whether any row waits, through the pending index.
const pendingSQL = `SELECT EXISTS (SELECT FROM outbox_messages WHERE published_at IS NULL)`

// RelayOnce claims up to BatchSize unpublished rows, publishes them, and marks
// them published, all in one transaction. It returns how many it published.
// The claim marks the rows in the same statement that locks them, so a batch
// costs three round trips to Postgres (begin, claim, commit) besides the
// broker's; the mark only counts once the transaction commits, after the
// broker acknowledged every row. The rows stay locked until then, so no other
// relay takes them; if anything fails before the commit, the rows are
// released unmarked and published again later: at least once.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	// Finish a started batch even if ctx ends: abandoning it would only mean
	// publishing it twice.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer cancel()

	var n int
	err := pgx.BeginTxFunc(ctx, r.cfg.Pool, claimTx, func(tx pgx.Tx) error {
		args := []any{planEachTime, r.cfg.BatchSize, relayLockKey}
		claim := claimSQL
		if r.cfg.Parallel {
			claim, args = claimParallelSQL, args[:2]
		}
		rows, err := tx.Query(ctx, claim, args...)
		if err != nil {
			return fmt.Errorf("claiming rows: %w", err)
		}
		var batch []pending
		for rows.Next() {
			var p pending
			var meta []byte
			if err := rows.Scan(&p.id, &p.msgID, &p.topic, &p.payload, &meta); err != nil {
				rows.Close()
				return fmt.Errorf("reading row: %w", err)
			}
			p.meta = message.Metadata{}
			if err := json.Unmarshal(meta, &p.meta); err != nil {
				rows.Close()
				return fmt.Errorf("row %d: decoding metadata: %w", p.id, err)
			}
			batch = append(batch, p)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("claiming rows: %w", err)
		}
		if len(batch) == 0 {
			return nil
		}
		// RETURNING gives no order; the claim took the lowest ids.
		slices.SortFunc(batch, func(a, b pending) int { return cmp.Compare(a.id, b.id) })
		failpoint.Hit(failpoint.AfterClaimBeforePublish, batch[0].msgID)

		if err := r.publish(batch); err != nil {
			return err
		}
		failpoint.Hit(failpoint.AfterPublishBeforeMark, batch[0].msgID)
		n = len(batch)
		return nil // the commit makes the claim's mark count
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		r.stats.published.Add(int64(n))
		r.stats.batches.Add(1)
	}
	return n, nil
}

// claimSQL locks and marks the lowest unpublished ids, up to $1, if this
// relay is the leader: the advisory lock $2, taken once per statement (an
// uncorrelated subquery is evaluated once, before any row is read), makes
// replicas take turns, so rows leave in id order and one key's messages keep
// their order. A replica that is not the leader claims nothing.
const claimSQL = `
	UPDATE outbox_messages SET published_at = now()
	WHERE id = ANY(ARRAY(
		SELECT id FROM outbox_messages
		WHERE published_at IS NULL AND (SELECT pg_try_advisory_xact_lock($2))
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING id, message_id, topic, payload, metadata`

// claimParallelSQL is claimSQL without the lock, for RelayConfig.Parallel:
// every replica claims, skipping the rows the others have locked.
const claimParallelSQL = `
	UPDATE outbox_messages SET published_at = now()
	WHERE id = ANY(ARRAY(
		SELECT id FROM outbox_messages
		WHERE published_at IS NULL
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING id, message_id, topic, payload, metadata`

// planEachTime, passed before a statement's arguments, has Postgres plan the
// statement for its actual arguments every time (pgx's one-round-trip
// unnamed statement) instead of reusing a prepared statement. A prepared
// statement settles on a generic plan after five executions, and one made
// while outbox_messages was nearly empty, as it is when a service starts,
// scans the table sequentially forever after: under load the mark below was
// seen scanning 8,000 rows for every 50 it marked, ~20 ms a batch, and the
// table only grows until retention. Planning each time costs microseconds
// per batch.
var planEachTime = pgx.QueryExecModeExec

// claimTx begins the relay's transaction with bitmap scans off, in the same
// round trip. Published rows leave dead entries in the pending index until
// vacuum runs (autovacuum visits a database about once a minute); a bitmap
// scan visits the heap for every one of them on every claim (seen: 2,800
// entries, 180 pages, 7 ms to claim one row), while an index scan in id
// order stops at LIMIT and marks the dead entries it passes, so the next
// claim skips them without touching the heap.
var claimTx = pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL enable_bitmapscan = off"}

type pending struct {
	id      int64
	msgID   string
	topic   string
	payload []byte
	meta    message.Metadata
}

// publish sends the batch in id order, one Publish call per run of rows that
// share a topic.
func (r *Relay) publish(batch []pending) error {
	for start := 0; start < len(batch); {
		end := start
		var msgs []*message.Message
		for end < len(batch) && batch[end].topic == batch[start].topic {
			msg := message.NewMessage(batch[end].msgID, batch[end].payload)
			msg.Metadata = batch[end].meta
			msgs = append(msgs, msg)
			end++
		}
		if err := r.cfg.Publisher.Publish(batch[start].topic, msgs...); err != nil {
			return fmt.Errorf("publishing %d messages to %s: %w", len(msgs), batch[start].topic, err)
		}
		start = end
	}
	return nil
}

// listen holds a connection that LISTENs on NotifyChannel and turns each
// notification into a wake-up. A lost connection is re-established; the poll
// covers the gap.
func (r *Relay) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Logger.Error("Outbox listener lost; falling back to polling until it reconnects", err, nil)
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
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
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

// retain deletes published rows older than Retention, in batches.
func (r *Relay) retain(ctx context.Context) {
	ctxtime.Every(ctx, r.cfg.RetentionInterval, func() {
		if _, err := r.DeletePublished(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Logger.Error("Outbox retention failed", err, nil)
		}
	})
}

// DeletePublished removes rows published more than Retention ago, at most
// RetentionBatch per statement, and returns how many it removed.
func (r *Relay) DeletePublished(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := r.cfg.Pool.Exec(ctx, `
			DELETE FROM outbox_messages
			WHERE id IN (
				SELECT id FROM outbox_messages
				WHERE published_at < now() - $1::interval
				ORDER BY published_at
				LIMIT $2)`, planEachTime, r.cfg.Retention, r.cfg.RetentionBatch)
		if err != nil {
			return total, fmt.Errorf("outbox retention: %w", err)
		}
		total += tag.RowsAffected()
		r.stats.deleted.Add(tag.RowsAffected())
		if tag.RowsAffected() < int64(r.cfg.RetentionBatch) {
			return total, nil
		}
	}
}
