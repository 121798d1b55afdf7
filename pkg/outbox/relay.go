package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
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
	// tries again; it doubles with each failure in a row, up to
	// MaxErrorBackoff, and starts over after a batch succeeds. Defaults to
	// 200ms.
	ErrorBackoff time.Duration
	// MaxErrorBackoff caps the wait between failed batches. Defaults to 10s
	// (or ErrorBackoff, if that is longer).
	MaxErrorBackoff time.Duration
	// MaxMessageBytes is the largest message, measured by RecordBytes, the
	// relay sends; a larger row is parked (see Parked) without a send. Keep
	// it equal to the publisher's limit (Sarama's Producer.MaxMessageBytes)
	// and to the Writer's. Defaults to DefaultMaxMessageBytes.
	MaxMessageBytes int
	// IsPermanent tells a refusal of a message itself (the broker will never
	// take it) from a transient failure, for the errors Publisher returns.
	// When a batch fails permanently, the relay publishes its rows one by
	// one and parks those refused. Defaults to IsPermanent.
	IsPermanent func(error) bool
	// BatchTimeout bounds one claim-publish-mark transaction. A batch in
	// flight when Run's context ends is finished, within this bound, so a
	// graceful shutdown does not republish it. It is also the fence: a
	// relay whose transaction sits idle longer than BatchTimeout + 1s (a
	// paused process, a publish that never returns) has its session ended by
	// Postgres, so a standby takes the lead and the rows. Defaults to 30s.
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
	if c.MaxErrorBackoff == 0 {
		c.MaxErrorBackoff = max(10*time.Second, c.ErrorBackoff)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.IsPermanent == nil {
		c.IsPermanent = IsPermanent
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
	case c.MaxErrorBackoff < c.ErrorBackoff:
		return errors.New("outbox: RelayConfig.MaxErrorBackoff must not be below ErrorBackoff")
	case c.MaxMessageBytes < 0:
		return errors.New("outbox: RelayConfig.MaxMessageBytes must not be negative")
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
	Parked    int64 // rows parked because the broker will never take them
	Deleted   int64 // published rows removed by retention
}

// Relay publishes committed outbox rows at least once.
type Relay struct {
	cfg     RelayConfig
	claimTx pgx.TxOptions // see txOptions
	wake    chan struct{}
	stats   struct{ published, batches, errors, parked, deleted atomic.Int64 }
}

// NewRelay checks cfg and returns a relay; Run starts it.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, wake: make(chan struct{}, 1)}
	r.claimTx = r.txOptions()
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
			return nil // shutting down during the pending check
		case err != nil:
			failures++
			r.stats.errors.Add(1)
			wait := r.backoff(failures)
			r.cfg.Logger.Error("Relay batch failed; rows will be retried", err,
				watermill.LogFields{"failures_in_a_row": failures, "retry_in": wait.String()})
			if !ctxtime.Sleep(ctx, wait) {
				return nil
			}
			continue
		case n == r.cfg.BatchSize:
			failures = 0
			if ctx.Err() != nil {
				return nil
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
			return nil
		case <-r.wake:
			polled = false
		case <-poll.C:
			polled = true
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
		var pending bool
		if err := r.cfg.Pool.QueryRow(ctx, pendingSQL, planEachTime).Scan(&pending); err != nil {
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
	res, err := r.relayOnce(ctx)
	return res.published, err
}

func (r *Relay) relayOnce(ctx context.Context) (sent, error) {
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
		r.cfg.Logger.Error("Relay parked an outbox row the broker will not take; its key waits until it is retried or dropped",
			errors.New(p.reason), watermill.LogFields{"row": p.id, "message_id": p.msgID, "topic": p.topic, "key": p.key})
	}
	return res, res.err
}

// claim locks and marks the next batch of rows, in id order.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx) ([]pending, error) {
	args := []any{planEachTime, r.cfg.BatchSize, relayLockKey}
	claim := claimSQL
	if r.cfg.Parallel {
		claim, args = claimParallelSQL, args[:2]
	}
	rows, err := tx.Query(ctx, claim, args...)
	if err != nil {
		return nil, fmt.Errorf("claiming rows: %w", err)
	}
	var batch []pending
	for rows.Next() {
		var p pending
		var meta []byte
		if err := rows.Scan(&p.id, &p.msgID, &p.topic, &p.key, &p.payload, &meta); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading row: %w", err)
		}
		p.meta = message.Metadata{}
		if err := json.Unmarshal(meta, &p.meta); err != nil {
			rows.Close()
			return nil, fmt.Errorf("row %d: decoding metadata: %w", p.id, err)
		}
		batch = append(batch, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming rows: %w", err)
	}
	// RETURNING gives no order; the claim took the lowest ids.
	slices.SortFunc(batch, func(a, b pending) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}

// claimSQL locks and marks the lowest sendable ids, up to $1, if this relay
// is the leader: the advisory lock $2, taken once per statement (an
// uncorrelated subquery is evaluated once, before any row is read), makes
// replicas take turns, so rows leave in id order and one key's messages keep
// their order. A replica that is not the leader claims nothing.
const claimSQL = `
	UPDATE outbox_messages SET published_at = now()
	WHERE id = ANY(ARRAY(
		SELECT id FROM outbox_messages m
		WHERE ` + sendable + ` AND (SELECT pg_try_advisory_xact_lock($2))
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING id, message_id, topic, partition_key, payload, metadata`

// claimParallelSQL is claimSQL without the lock, for RelayConfig.Parallel:
// every replica claims, skipping the rows the others have locked.
const claimParallelSQL = `
	UPDATE outbox_messages SET published_at = now()
	WHERE id = ANY(ARRAY(
		SELECT id FROM outbox_messages m
		WHERE ` + sendable + `
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED))
	RETURNING id, message_id, topic, partition_key, payload, metadata`

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

// fencingGrace is how long past BatchTimeout Postgres lets the relay's
// transaction sit idle before it ends the session (see txOptions).
const fencingGrace = time.Second

// txOptions begins the relay's transaction, in one round trip, with:
//
//   - bitmap scans off. Published rows leave dead entries in the pending
//     index until vacuum runs (autovacuum visits a database about once a
//     minute); a bitmap scan visits the heap for every one of them on every
//     claim (seen: 2,800 entries, 180 pages, 7 ms to claim one row), while
//     an index scan in id order stops at LIMIT and marks the dead entries it
//     passes, so the next claim skips them without touching the heap.
//   - the fence. The relay's lead (the advisory lock) and its marks live in
//     this one transaction, so a relay can only commit marks while it still
//     leads. A relay that stops mid-batch (a paused process, a publish that
//     never returns) must not keep the lead: idle_in_transaction_session_
//     timeout ends its session BatchTimeout + fencingGrace after its last
//     statement (the relay itself gives up at BatchTimeout), which frees the
//     lock and the rows for a standby; its marks can then never commit. Its
//     sends still in flight only repeat rows the next leader sends again, in
//     the same order, so a consumer sees duplicates, never a key reordered.
//   - TCP keepalives on the server's side of the socket, so a relay whose
//     host vanished (no FIN, no RST) is found dead within ~11 s instead of
//     the kernel's two hours, with the same effect.
func (r *Relay) txOptions() pgx.TxOptions {
	idle := (r.cfg.BatchTimeout + fencingGrace).Milliseconds()
	return pgx.TxOptions{BeginQuery: fmt.Sprintf(
		"BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL idle_in_transaction_session_timeout = %d; "+
			"SET LOCAL tcp_keepalives_idle = 5; SET LOCAL tcp_keepalives_interval = 2; SET LOCAL tcp_keepalives_count = 3", idle)}
}

type pending struct {
	id      int64
	msgID   string
	topic   string
	key     string
	payload []byte
	meta    message.Metadata
}

// orderKey is what a parked row holds up: its topic and partition key.
type orderKey struct{ topic, key string }

// parking is a row to park, and why.
type parking struct {
	pending
	reason string
}

// sent is what became of a claimed batch.
type sent struct {
	claimed   int
	published int       // acknowledged by the broker
	parked    []parking // refused for good
	unsent    []int64   // not sent: behind a parked row of their key, or stopped by err
	err       error     // the transient failure that stopped the batch, if one did
}

// send publishes batch. A row over MaxMessageBytes is parked without a send.
// When the broker refuses the batch for good, send publishes its rows one at
// a time, in order, to find the refused ones, and parks them. A row behind a
// parked one of its key is not sent. A transient failure stops send; what
// was published before it counts.
func (r *Relay) send(batch []pending) sent {
	res := sent{claimed: len(batch)}
	held := map[orderKey]bool{}
	park := func(p pending, reason string) {
		res.parked = append(res.parked, parking{p, reason})
		if p.key != "" {
			held[orderKey{p.topic, p.key}] = true
		}
	}
	var ready []pending
	for _, p := range batch {
		n := recordBytes(p.msgID, p.meta, len(p.payload))
		switch {
		case held[orderKey{p.topic, p.key}]:
			res.unsent = append(res.unsent, p.id)
		case n > r.cfg.MaxMessageBytes:
			park(p, fmt.Sprintf("message is %d bytes as a Kafka record (payload %d), over the relay's %d-byte MaxMessageBytes",
				n, len(p.payload), r.cfg.MaxMessageBytes))
		default:
			ready = append(ready, p)
		}
	}
	err := r.publish(ready)
	switch {
	case err == nil:
		res.published = len(ready)
		return res
	case !r.cfg.IsPermanent(err):
		res.err = err
		for _, p := range ready {
			res.unsent = append(res.unsent, p.id)
		}
		return res
	}
	// Some row is refused for good: find it, one row at a time.
	for i, p := range ready {
		if held[orderKey{p.topic, p.key}] {
			res.unsent = append(res.unsent, p.id)
			continue
		}
		switch err := r.publish(ready[i : i+1]); {
		case err == nil:
			res.published++
		case r.cfg.IsPermanent(err):
			park(p, "the broker refused it: "+err.Error())
		default:
			res.err = err
			for _, q := range ready[i:] {
				res.unsent = append(res.unsent, q.id)
			}
			return res
		}
	}
	return res
}

// unclaim takes the claim's mark back from the rows res did not publish,
// and parks the refused ones with their reasons.
func (r *Relay) unclaim(ctx context.Context, tx pgx.Tx, res sent) error {
	if len(res.unsent) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE outbox_messages SET published_at = NULL WHERE id = ANY($1)`, res.unsent); err != nil {
			return fmt.Errorf("releasing unsent rows: %w", err)
		}
	}
	if len(res.parked) == 0 {
		return nil
	}
	ids := make([]int64, len(res.parked))
	reasons := make([]string, len(res.parked))
	for i, p := range res.parked {
		ids[i], reasons[i] = p.id, strings.ToValidUTF8(p.reason, "?")
	}
	_, err := tx.Exec(ctx, `
		UPDATE outbox_messages m SET published_at = NULL, parked_at = now(), park_reason = p.reason
		FROM unnest($1::bigint[], $2::text[]) AS p(id, reason)
		WHERE m.id = p.id`, ids, reasons)
	if err != nil {
		return fmt.Errorf("parking %d rows: %w", len(ids), err)
	}
	return nil
}

// publish sends the rows in id order, one Publish call per run of rows that
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
