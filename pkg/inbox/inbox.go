package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the inbox's SQL migrations, for projects that run their
// own migration tool. Migrate applies them. Dead letters are published
// through the outbox, so apply outbox.Migrations too.
var Migrations, _ = fs.Sub(migrations, "migrations")

// Migrate creates or upgrades the inbox tables, and the outbox table its
// dead letters are published through (outbox.Migrate). It is safe to call
// from several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("inbox: the outbox its dead letters go through: %w", err)
	}
	return migrate.Apply(ctx, pool, "inbox", Migrations)
}

// New checks cfg and returns an Inbox.
func New(cfg Config) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, spanName: "inbox " + cfg.Consumer, stages: newStages(cfg)}
	in.keys = newKeyPolicy(in)
	return in, nil
}

// Consumer returns the configured consumer name.
func (in *Inbox) Consumer() string { return in.cfg.Consumer }

// ErrRunning is returned by Run when the Inbox is already running.
var ErrRunning = errors.New("inbox: Run is already running")

// Run does the inbox's background work until ctx ends, and returns nil then:
//
//   - with Config.BatchSize > 1, it runs Config.BatchWorkers batch
//     transactions at a time, so that deliveries that arrive together share
//     one (batch.go). Deliveries that arrive while Run is not running are
//     applied alone: correct, only slower. When ctx ends it takes no more
//     deliveries into batches, and returns once the batches it took have
//     committed and answered their deliveries;
//   - every Config.RetentionInterval it deletes inbox rows past
//     Config.Retention (Sweep, retention.go), and logs what a sweep that
//     failed said.
//
// Run it beside the router, and beside the outbox's Relay.Run, for as long
// as the consumer runs. It is an error to call Run while it runs, and it
// returns an error at once when inbox_messages is partitioned and
// Config.Partitions is not set, or the other way round.
func (in *Inbox) Run(ctx context.Context) error {
	if !in.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer in.running.Store(false)
	if err := in.checkShapeOnce(ctx); err != nil { // partition.go
		return err
	}
	if err := in.register(ctx); err != nil {
		return err
	}
	if in.cfg.BatchSize > 1 {
		stop := in.startBatches() // batch.go
		defer stop()
	}
	in.ready.Store(true)
	defer in.ready.Store(false)
	in.sweepEvery(ctx, in.cfg.RetentionInterval) // retention.go
	return nil
}

// register records where the consumer takes its redrives from
// (Config.RedriveTopic), for a redrive from any process to read.
func (in *Inbox) register(ctx context.Context) error {
	if _, err := in.cfg.Pool.Exec(ctx, `INSERT INTO inbox_consumers AS c (consumer, redrive_topic) VALUES ($1, $2)
		ON CONFLICT (consumer) DO UPDATE SET redrive_topic = excluded.redrive_topic, updated_at = now()
		WHERE c.redrive_topic <> excluded.redrive_topic`, in.cfg.Consumer, in.cfg.RedriveTopic); err != nil {
		return fmt.Errorf("inbox: recording the redrive topic of %s: %w", in.cfg.Consumer, err)
	}
	return nil
}

// RedriveTopic returns Config.RedriveTopic: subscribe the inbox's handler
// to it too when it is set.
func (in *Inbox) RedriveTopic() string { return in.cfg.RedriveTopic }

// Running reports whether Run is running and its batch workers take
// deliveries: for a readiness check, or a test that must not deliver before.
func (in *Inbox) Running() bool { return in.ready.Load() }

// newKeyPolicy returns the policy cfg.OnDeadLetter names.
func newKeyPolicy(in *Inbox) keyPolicy {
	if in.cfg.OnDeadLetter == HoldKey {
		return holdKey{skipKey{in}}
	}
	return skipKey{in}
}

// Stats returns the outcome counters.
func (in *Inbox) Stats() Stats {
	return Stats{
		Applied:      in.stats[0].Load(),
		Duplicates:   in.stats[1].Load(),
		Conflicts:    in.stats[2].Load(),
		Invalid:      in.stats[3].Load(),
		DeadLettered: in.stats[4].Load(),
		Retries:      in.stats[5].Load(),
		Parked:       in.stats[6].Load(),
	}
}
