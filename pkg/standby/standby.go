// Package standby holds back what a service tells the world about a
// transaction (an event published, a Kafka offset committed, an answer
// given) until the standbys a failover would promote hold that transaction.
//
// On a Postgres replicated asynchronously, a failover loses the last
// transactions the old primary committed. If the outbox relay already
// published an event of one of them, consumers apply an event whose cause no
// longer exists (a ghost); if a consumer already committed the offset of a
// message whose inbox row was in one of them, the message is lost. A Gate
// closes both: the relay (outbox.RelayConfig.Standby), the inbox
// (inbox.Config.Standby) and the effect runner (effect.Config.Standby)
// mark each transaction whose effects leave the database, and wait, before
// they leave, until Standbys of the primary's streaming standbys have
// flushed it. The rest of the database keeps replicating asynchronously: a
// commit does not wait; only what leaves it does.
//
// Where it reads: the primary's physical replication slots
// (pg_replication_slots.restart_lsn, which a streaming standby's flush
// reports move), so the cluster must replicate through slots (Patroni's
// use_slots, the default; CloudNativePG's HA slots). A failover must
// promote a standby that holds at least what every other reachable standby
// holds (Patroni promotes the most advanced healthy replica; before 3.0.3,
// on etcd3, a paused former leader could take the lock back from the
// replica promoted meanwhile, patroni#2689): then, with
// Standbys 1, the loss of the primary alone loses nothing that left; with
// Standbys equal to the number of standbys, any one survivor holds it all,
// and a standby that stops streaming stops the gate. docs/failover.md says
// what each setting buys.
//
// A primary that changed between a transaction's Mark and the moment the
// gate would release it (a promotion: a new timeline) fails the wait with
// ErrPrimaryChanged: the caller does not let the effect leave (the relay
// publishes the rows again later, the inbox leaves the offset for a
// redelivery), since the transaction may be gone.
package standby

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/internal/check"
)

// ErrPrimaryChanged is Wait's error when the primary a transaction
// committed on is no longer the primary: a failover may have lost it.
var ErrPrimaryChanged = errors.New("standby: the primary changed before its standbys held the transaction (a failover may have lost it)")

// errNoTicket is Wait's error for a Ticket no Mark returned.
var errNoTicket = errors.New("standby: Wait called with a Ticket no Mark returned")

// Config configures a Gate.
type Config struct {
	// Pool reaches the primary (a multi-host URL with
	// target_session_attrs=read-write, or a proxy that follows it).
	// Required.
	Pool *pgxpool.Pool
	// Standbys is how many streaming standbys must have flushed a
	// transaction before the gate releases it. Defaults to 1.
	Standbys int
	// Slots, when set, are the physical replication slots of the standbys
	// a failover may promote; the others (a delayed or archive standby) do
	// not count. Empty: every active physical slot counts.
	Slots []string
	// PollInterval is how often, while anything waits, the gate reads the
	// primary's position and its standbys'; a wait that begins is read for
	// at once. Nothing is read while nothing waits. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
	// ReadTimeout bounds one read: a primary that stopped answering (cut
	// off, frozen) is left for a new connection, which reaches the primary
	// the failover promoted. Defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
	// Logger receives what goes wrong and, at Warn, a wait that lasts
	// (standbys that stopped streaming). Defaults to discarding it.
	Logger *slog.Logger
}

// The defaults of Config's zero fields.
const (
	DefaultPollInterval = 500 * time.Microsecond
	DefaultReadTimeout  = 5 * time.Second
)

// slowWait is how long a wait lasts before the gate says so (once a
// slowWait, while it lasts).
const slowWait = 5 * time.Second

// Validate reports the first invalid field, after the defaults of zero
// fields.
func (c Config) Validate() error {
	c.setDefaults()
	f := check.Config("standby: Config")
	f.Required("Pool", c.Pool != nil)
	f.That(c.Standbys >= 1, "Standbys must be at least 1")
	check.AtLeast(f, "PollInterval", c.PollInterval, 100*time.Microsecond)
	check.AtLeast(f, "ReadTimeout", c.ReadTimeout, time.Millisecond)
	return f.Err()
}

func (c *Config) setDefaults() {
	c.Standbys = cmp.Or(c.Standbys, 1)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Gate releases waits once the primary's standbys hold what they wait for.
// A nil *Gate releases every wait at once (no replicas to wait for): callers
// hold one whether or not it is configured. A Gate is safe for concurrent
// use, and one per database serves every component of a process: the waits
// of a whole process share one read per PollInterval.
type Gate struct {
	cfg Config

	mu      sync.Mutex
	waiters []*waiter
	polling bool          // a poll loop runs (while waiters is not empty)
	arrived chan struct{} // a wait began: read now, not after PollInterval

	stats struct{ released, changed, reads, readErrors atomic.Int64 }
}

// Ticket names the primary a transaction ran on (its timeline: a promotion
// starts a new one). Mark returns it; Wait takes it.
type Ticket struct {
	timeline uint32
	// unflushed: the transaction committed with synchronous_commit off,
	// so its commit may not be flushed when it returns; its wait targets
	// the position WAL is inserted at, not the one flushed.
	unflushed bool
}

// Stats counts what a Gate did.
type Stats struct {
	Waiting        int   // waits not released yet
	Released       int64 // waits released: their standbys held them
	PrimaryChanged int64 // waits failed with ErrPrimaryChanged
	Reads          int64 // reads of the positions
	ReadErrors     int64 // reads that failed (the next one retries)
}

// New checks cfg and returns a Gate.
func New(cfg Config) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	cfg.Slots = slices.Clone(cfg.Slots)
	return &Gate{cfg: cfg, arrived: make(chan struct{}, 1)}, nil
}

// Stats returns the gate's counters.
func (g *Gate) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	g.mu.Lock()
	waiting := len(g.waiters)
	g.mu.Unlock()
	return Stats{
		Waiting: waiting, Released: g.stats.released.Load(), PrimaryChanged: g.stats.changed.Load(),
		Reads: g.stats.reads.Load(), ReadErrors: g.stats.readErrors.Load(),
	}
}

// Querier is what Mark reads through: a pgx.Tx (or a connection inside a
// transaction).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// markSQL reads the timeline WAL is written on now (the first eight hex
// digits of the current WAL file's name; pg_control_checkpoint's timeline
// lags a promotion until the next checkpoint), and whether the commit will
// return before it is flushed.
const markSQL = `SELECT pg_walfile_name(pg_current_wal_insert_lsn()), current_setting('synchronous_commit') = 'off'`

// Mark reads, in tx before it commits, which primary tx runs on. Wait with
// the Ticket after the commit. One round trip; nothing on a nil Gate.
func (g *Gate) Mark(ctx context.Context, tx Querier) (Ticket, error) {
	if g == nil {
		return Ticket{}, nil
	}
	var file string
	var unflushed bool
	if err := tx.QueryRow(ctx, markSQL).Scan(&file, &unflushed); err != nil {
		return Ticket{}, fmt.Errorf("standby: reading the primary's timeline: %w", err)
	}
	tl, err := timelineOf(file)
	if err != nil {
		return Ticket{}, err
	}
	return Ticket{timeline: tl, unflushed: unflushed}, nil
}

func timelineOf(walfile string) (uint32, error) {
	if len(walfile) < 8 {
		return 0, fmt.Errorf("standby: %q is not a WAL file name", walfile)
	}
	tl, err := strconv.ParseUint(walfile[:8], 16, 32)
	if err != nil || tl == 0 {
		return 0, fmt.Errorf("standby: %q is not a WAL file name", walfile)
	}
	return uint32(tl), nil
}

// Wait returns nil once Standbys standbys hold every transaction that
// committed, on t's primary, before Wait was called (the one t was marked
// in, in particular); ErrPrimaryChanged if the primary changed first; or
// ctx's error. On a nil Gate it returns nil at once.
func (g *Gate) Wait(ctx context.Context, t Ticket) error {
	if g == nil {
		return nil
	}
	if t.timeline == 0 {
		return errNoTicket
	}
	w := &waiter{Ticket: t, target: -1, since: time.Now(), done: make(chan error, 1)}
	g.mu.Lock()
	g.waiters = append(g.waiters, w)
	start := !g.polling
	g.polling = true
	g.mu.Unlock()
	if start {
		go g.poll()
	} else {
		select { // its target is the next read's: no need to wait out the interval
		case g.arrived <- struct{}{}:
		default:
		}
	}
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		g.mu.Lock()
		g.waiters = slices.DeleteFunc(g.waiters, func(o *waiter) bool { return o == w })
		g.mu.Unlock()
		return fmt.Errorf("standby: waiting for the standbys: %w", ctx.Err())
	}
}

// waiter is one Wait.
type waiter struct {
	Ticket
	// target is the primary's WAL flush position (insert position, for an
	// unflushed Ticket) read by the first read that began after the wait
	// did: every transaction committed before the wait ends at or below it
	// (a commit returns once flushed, unless synchronous_commit is off).
	// -1 until then. Only the poll loop touches it.
	target int64
	since  time.Time
	said   time.Time // when the gate last said the wait lasts
	done   chan error
}

// position is one read: the primary's timeline, its WAL insert and flush
// positions, and where each counted standby's flush stands.
type position struct {
	timeline      uint32
	insert, flush int64
	flushed       []int64 // the counted slots', highest first
}

// held is the highest position Standbys standbys hold, or -1.
func (p position) held(standbys int) int64 {
	if len(p.flushed) < standbys {
		return -1
	}
	return p.flushed[standbys-1]
}

// positionSQL reads a position in one statement. An active slot's
// restart_lsn is the flush position its standby last reported (it reports
// each flush); an inactive slot's standby is not streaming, and a slot
// reserved but never streamed to holds a position its standby never had:
// neither counts.
const positionSQL = `
	SELECT pg_walfile_name(pg_current_wal_insert_lsn()),
	       (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint,
	       (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint,
	       ARRAY(SELECT (restart_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots
	             WHERE slot_type = 'physical' AND active AND restart_lsn IS NOT NULL
	               AND (coalesce(cardinality($1::text[]), 0) = 0 OR slot_name = ANY($1::text[])))`

// poll reads positions while anything waits, and settles the waits each
// read decides.
func (g *Gate) poll() {
	failures := 0
	for {
		g.mu.Lock()
		if len(g.waiters) == 0 {
			g.polling = false
			g.mu.Unlock()
			return
		}
		// Only waits that began before this read may take its insert
		// position as their target.
		batch := slices.Clone(g.waiters)
		g.mu.Unlock()

		pos, err := g.read()
		if err != nil {
			failures++
			g.stats.readErrors.Add(1)
			if failures == 1 || failures%100 == 0 {
				g.cfg.Logger.Warn("standby gate: cannot read the primary's position; waits go on", "err", err, "failures_in_a_row", failures)
			}
			time.Sleep(min(g.cfg.PollInterval<<min(failures, 10), time.Second))
			continue
		}
		failures = 0
		g.settle(batch, pos)
		// The next read once the standbys had time to report, or at once
		// for a wait that began since this read did.
		t := time.NewTimer(g.cfg.PollInterval)
		select {
		case <-g.arrived:
		case <-t.C:
		}
		t.Stop()
	}
}

func (g *Gate) read() (position, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ReadTimeout)
	defer cancel()
	g.stats.reads.Add(1)
	var file string
	var p position
	if err := g.cfg.Pool.QueryRow(ctx, positionSQL, g.cfg.Slots).Scan(&file, &p.insert, &p.flush, &p.flushed); err != nil {
		return position{}, err
	}
	tl, err := timelineOf(file)
	if err != nil {
		return position{}, err
	}
	p.timeline = tl
	slices.SortFunc(p.flushed, func(a, b int64) int { return cmp.Compare(b, a) })
	return p, nil
}

// settle releases or fails each wait of batch that pos decides.
func (g *Gate) settle(batch []*waiter, pos position) {
	held := pos.held(g.cfg.Standbys)
	now := time.Now()
	for _, w := range batch {
		var err error
		switch {
		case w.timeline != pos.timeline:
			err = ErrPrimaryChanged
		case w.target < 0:
			w.target = pos.flush
			if w.unflushed {
				w.target = pos.insert
			}
			if held < w.target {
				continue
			}
		case held < w.target:
			if now.Sub(w.since) >= slowWait && now.Sub(w.said) >= slowWait {
				w.said = now
				g.cfg.Logger.Warn("standby gate: waiting for the standbys to hold a transaction",
					"waited", now.Sub(w.since).Round(time.Millisecond).String(), "standbys_needed", g.cfg.Standbys,
					"streaming", len(pos.flushed), "behind_bytes", w.target-held)
			}
			continue
		}
		g.finish(w, err)
	}
}

// finish ends w's wait with err (nil: released), unless it ended already.
func (g *Gate) finish(w *waiter, err error) {
	g.mu.Lock()
	n := len(g.waiters)
	g.waiters = slices.DeleteFunc(g.waiters, func(o *waiter) bool { return o == w })
	gone := n == len(g.waiters) // its ctx ended first
	g.mu.Unlock()
	if gone {
		return
	}
	if err != nil {
		g.stats.changed.Add(1)
	} else {
		g.stats.released.Add(1)
	}
	w.done <- err
}
