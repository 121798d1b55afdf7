package main

// The soak (-soak D): the two ways of retiring inbox and outbox rows, side
// by side in one run on one Postgres, for D (20 minutes for issue #29's
// goal):
//
//   - delete: the plain inbox_messages and outbox_messages, Inbox.Sweep and
//     the relay's retention deleting the rows past retention in batches;
//   - partitions: inbox_messages partitioned by id time
//     (inbox.PartitionByIDTime, Config.Partitions) and outbox_messages by
//     blocks of ids (outbox.PartitionByTime, RelayConfig.Partitions), both
//     retired by dropping whole partitions.
//
// Each build is one pkg/inbox consumer on a database of its own, run as the
// services run theirs (Inbox.Handler, batches of up to 64, Inbox.Run), with
// a handler that inserts one domain row and writes one outbox message
// (outbox.PublishTx, one of 256 keys) per message, and one pkg/outbox relay
// publishing them to a publisher that acknowledges at once (Kafka is not
// what is measured here). Both are fed the same
// steady rate by soakWorkers goroutines, each handing over one message at a
// time as a Kafka partition does; one delivery in a hundred is a copy of an
// earlier message, which the inbox suppresses. Kafka is not in this loop:
// the subject is the table, and the hop through Kafka is what the other
// benchmarks measure.
//
// Retention is scaled down so that rows are retired all through the run:
// rows are kept for soakRetention, partitions span soakInterval, and the
// sweep runs every soakSweepEvery. In the middle third of the run a
// transaction is held open in each database (REPEATABLE READ, one read of
// another table), as a report or a forgotten session would: vacuum cannot
// remove what it could otherwise see is dead.
//
// Every soakSample it records, per build: messages handled per second
// (applied, or suppressed as copies), delivery latency p50/p99 (from when
// the message was due to the commit of its batch, so waiting for a free
// worker counts; offers no worker was free for are counted as dropped),
// each table's size with its indexes, and its live and dead tuples
// (pg_stat_user_tables, summed over the partitions). A sample is labelled
// by what held during its whole interval. At the end it checks that no
// message was applied twice or quarantined, no sweep failed and the relay
// published without an error.
//
// Both builds share one Postgres and one process: a cost one of them puts
// on the machine (its vacuum, its WAL) lands on the other's latency too, so
// the soak compares what the tables keep, not the two builds' tails.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

const (
	soakRetention  = 2 * time.Minute
	soakInterval   = time.Minute
	soakSweepEvery = 10 * time.Second
	soakWorkers    = 16
)

// SoakSample is one build's figures over one sample interval.
type SoakSample struct {
	AtS        float64 `json:"at_s"`
	Phase      string  `json:"phase"` // before, long_tx (the transaction is open), after
	AppliedPS  float64 `json:"applied_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	TableMB    float64 `json:"table_and_indexes_mb"`
	LiveTuples int64   `json:"live_tuples"`
	DeadTuples int64   `json:"dead_tuples"`
	Partitions int     `json:"partitions,omitempty"`
	// The outbox's table, the same figures.
	OutboxMB         float64 `json:"outbox_table_and_indexes_mb"`
	OutboxLive       int64   `json:"outbox_live_tuples"`
	OutboxDead       int64   `json:"outbox_dead_tuples"`
	OutboxPartitions int     `json:"outbox_partitions,omitempty"`
}

// SoakBuild is one build's run.
type SoakBuild struct {
	Name    string       `json:"name"`
	Offered float64      `json:"offered_per_s"`
	Applied int64        `json:"applied"`
	Errors  int64        `json:"errors"`
	Swept   int64        `json:"rows_deleted_by_sweep"`
	Samples []SoakSample `json:"samples"`
	Dropped int64        `json:"offers_dropped"` // the workers were behind: offered late or not at all
	Sweeps  int64        `json:"sweep_errors"`
	// The relay: messages published, failed batches, rows it deleted.
	Published    int64 `json:"outbox_published"`
	RelayErrors  int64 `json:"relay_errors"`
	RelayDeleted int64 `json:"outbox_rows_deleted"`
	// Per phase: medians of the samples' throughput and p99, and the
	// largest dead-tuple count.
	Phases map[string]SoakPhase `json:"phases"`
}

// SoakPhase sums up a build's samples in one phase.
type SoakPhase struct {
	AppliedPS float64 `json:"applied_per_s_median"`
	P99Ms     float64 `json:"p99_ms_median"`
	MaxDead   int64   `json:"dead_tuples_max"`
	MaxMB     float64 `json:"table_and_indexes_mb_max"`
	// The outbox's.
	OutboxMaxDead int64   `json:"outbox_dead_tuples_max"`
	OutboxMaxMB   float64 `json:"outbox_table_and_indexes_mb_max"`
}

// SoakReport is what -soak writes (BENCH_SOAK_REPORT, default
// bench-soak-report.json).
type SoakReport struct {
	When      string            `json:"when"`
	Machine   map[string]string `json:"machine"`
	Duration  float64           `json:"duration_s"`
	Rate      float64           `json:"rate_per_s"`
	Retention float64           `json:"retention_s"`
	Interval  float64           `json:"partition_interval_s"`
	LongTx    [2]float64        `json:"long_tx_s"` // when it was opened and closed
	// What the databases hold at the end (domain rows, distinct ones,
	// quarantined messages), so that a failure does not hide in averages.
	Checks map[string]int64 `json:"checks"`
	Builds []SoakBuild      `json:"builds"`
}

// soakBuild is one build as it runs.
type soakBuild struct {
	name  string
	pool  *pgxpool.Pool
	in    *inbox.Inbox
	relay *outbox.Relay

	mu        sync.Mutex
	latencies []time.Duration // this sample interval's
	applied   int64           // this sample interval's
	total     int64
	errors    int64
	swept     int64
	sweepErrs int64
	dropped   int64
	runErr    error
}

func runSoak(ctx context.Context, d time.Duration, rate float64, sample time.Duration, say func(string, ...any)) error {
	if rate <= 0 {
		return fmt.Errorf("soak: -rate must be positive, not %g", rate)
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck
	builds := []*soakBuild{{name: "delete"}, {name: "partitions"}}
	for _, b := range builds {
		if b.pool, err = soakDatabase(ctx, pg, b.name); err != nil {
			return err
		}
		defer b.pool.Close()
		cfg := inbox.Config{
			Pool: b.pool, Consumer: "soak", BatchSize: 64, BatchWorkers: 1, BatchLinger: time.Millisecond,
			Retention: soakRetention, RedeliveryHorizon: soakRetention, RetentionInterval: time.Hour, // swept below, so it is counted
		}
		if b.name == "partitions" {
			p := inbox.Partitioning{Interval: soakInterval, Ahead: 3}
			if err := inbox.PartitionByIDTime(ctx, b.pool, p, time.Now().Add(-soakInterval)); err != nil {
				return err
			}
			cfg.Partitions = &p
		}
		if b.in, err = inbox.New(cfg); err != nil {
			return err
		}
		rcfg := outbox.RelayConfig{Pool: b.pool, Publisher: soakPublisher{}, Retention: soakRetention,
			RetentionInterval: time.Hour} // retained in sweep below, so that a failure counts
		if b.name == "partitions" {
			p := outbox.Partitioning{Interval: soakInterval, Ahead: 3}
			if err := outbox.PartitionByTime(ctx, b.pool, p); err != nil {
				return err
			}
			rcfg.Partitions = &p
		}
		if b.relay, err = outbox.NewRelay(rcfg); err != nil {
			return err
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // after stop, on every return
	defer stop()
	for _, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.in.Run(runCtx); err != nil {
				b.mu.Lock()
				b.runErr = errors.Join(b.runErr, err)
				b.mu.Unlock()
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.relay.Run(runCtx); err != nil {
				b.mu.Lock()
				b.runErr = errors.Join(b.runErr, fmt.Errorf("relay: %w", err))
				b.mu.Unlock()
			}
		}()
	}
	for _, b := range builds {
		for !b.in.Running() || !b.relay.Running() {
			b.mu.Lock()
			err := b.runErr
			b.mu.Unlock()
			if err != nil {
				return fmt.Errorf("soak %s: %w", b.name, err)
			}
			time.Sleep(10 * time.Millisecond) // the Runs start their workers
		}
		wg.Add(2)
		go func() { defer wg.Done(); b.sweep(runCtx, say) }()
		go func() { defer wg.Done(); b.feed(runCtx, rate) }()
	}

	start := time.Now()
	longFrom, longTo := d/3, 2*d/3
	say("soak: %s at %.0f messages/s into each build (delete, partitions); rows kept %s, partitions of %s; a transaction held open from %s to %s",
		d, rate, soakRetention, soakInterval, longFrom, longTo)
	report := SoakReport{When: start.UTC().Format(time.RFC3339), Machine: machine(), Duration: d.Seconds(), Rate: rate,
		Retention: soakRetention.Seconds(), Interval: soakInterval.Seconds()}
	samples := make([][]SoakSample, len(builds))
	var longTxs []pgx.Tx
	defer func() { // on an early return; after the run, there are none
		for _, tx := range longTxs {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	tick := time.NewTicker(sample)
	defer tick.Stop()
	// A sample is labelled by what held during its interval: the
	// transaction opens and closes right after the tick that ends the last
	// interval before, so each interval is wholly before, in, or after it.
	phase := "before"
	for elapsed := time.Duration(0); elapsed < d; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		elapsed = time.Since(start)
		for i, b := range builds {
			s, err := b.take(ctx, elapsed, sample, phase)
			if err != nil {
				return err
			}
			samples[i] = append(samples[i], s)
			say("soak %-10s %4.0fs %-7s %6.1f/s  p50 %6.1f ms  p99 %6.1f ms  inbox %6.1f MB live %7d dead %7d%s  outbox %6.1f MB live %7d dead %7d%s",
				b.name, s.AtS, s.Phase, s.AppliedPS, s.P50Ms, s.P99Ms, s.TableMB, s.LiveTuples, s.DeadTuples,
				map[bool]string{true: fmt.Sprintf(" (%d partitions)", s.Partitions)}[s.Partitions > 0],
				s.OutboxMB, s.OutboxLive, s.OutboxDead,
				map[bool]string{true: fmt.Sprintf(" (%d partitions)", s.OutboxPartitions)}[s.OutboxPartitions > 0])
		}
		switch {
		case phase == "long_tx" && elapsed+sample/2 >= longTo:
			for _, tx := range longTxs {
				_ = tx.Rollback(ctx)
			}
			longTxs, phase = nil, "after"
			report.LongTx[1] = time.Since(start).Seconds()
			say("soak: the transactions are closed")
		case phase == "before" && elapsed+sample/2 >= longFrom:
			for _, b := range builds {
				tx, err := openLongTx(ctx, b.pool)
				if err != nil {
					return err
				}
				longTxs = append(longTxs, tx)
			}
			phase = "long_tx"
			report.LongTx[0] = time.Since(start).Seconds()
			say("soak: a transaction is open in each database")
		}
	}
	for _, tx := range longTxs {
		_ = tx.Rollback(ctx)
	}
	longTxs = nil
	stop()
	wg.Wait()
	for _, b := range builds {
		if b.runErr != nil {
			return fmt.Errorf("soak %s: %w", b.name, b.runErr)
		}
	}

	report.Checks = map[string]int64{}
	for i, b := range builds {
		rs := b.relay.Stats()
		report.Builds = append(report.Builds, SoakBuild{Name: b.name, Offered: rate, Applied: b.total, Errors: b.errors,
			Swept: b.swept, Dropped: b.dropped, Sweeps: b.sweepErrs, Samples: samples[i], Phases: soakPhases(samples[i]),
			Published: rs.Published, RelayErrors: rs.Errors, RelayDeleted: rs.Deleted})
		// Every handled message is a domain row or a suppressed copy, and
		// none was quarantined or dead-lettered.
		var rows, distinct, quarantined int64
		if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM soak_applied), (SELECT count(DISTINCT message_id) FROM soak_applied),
			(SELECT count(*) FROM inbox_quarantine)`).Scan(&rows, &distinct, &quarantined); err != nil {
			return err
		}
		report.Checks[b.name+"_domain_rows"] = rows
		report.Checks[b.name+"_domain_rows_distinct"] = distinct
		report.Checks[b.name+"_quarantined"] = quarantined
	}
	for _, b := range report.Builds {
		say("soak %s: %d applied, %d errors; by phase: %+v", b.Name, b.Applied, b.Errors, b.Phases)
	}
	if err := writeReport(report, "BENCH_SOAK_REPORT", "bench-soak-report.json", say); err != nil {
		return err
	}
	for _, b := range report.Builds {
		c := func(k string) int64 { return report.Checks[b.Name+"_"+k] }
		switch {
		case b.Errors > 0 || b.Applied == 0 || b.Sweeps > 0:
			return fmt.Errorf("soak: the %s build handled %d messages with %d failed deliveries and %d failed sweeps", b.Name, b.Applied, b.Errors, b.Sweeps)
		case b.RelayErrors > 0 || b.Published == 0:
			return fmt.Errorf("soak: the %s build's relay published %d messages with %d failed batches", b.Name, b.Published, b.RelayErrors)
		case c("quarantined") > 0:
			return fmt.Errorf("soak: the %s build quarantined %d messages", b.Name, c("quarantined"))
		case c("domain_rows") != c("domain_rows_distinct"):
			return fmt.Errorf("soak: the %s build applied %d messages twice", b.Name, c("domain_rows")-c("domain_rows_distinct"))
		}
	}
	return nil
}

// soakDatabase returns a pool on a new database holding the inbox's tables
// and the handler's domain table.
func soakDatabase(ctx context.Context, pg *pgtest.Server, name string) (*pgxpool.Pool, error) {
	url, err := pg.CreateDatabase(ctx, "soak_"+name)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8 // the batch worker, the sweep, the long transaction, the samples, with room
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := inbox.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE soak_applied (message_id text NOT NULL, at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE soak_report (n int)`)
	return pool, err
}

// openLongTx opens a transaction that holds a snapshot, and nothing else.
func openLongTx(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM soak_report`).Scan(&n); err != nil {
		return nil, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, nil
}

// feed hands messages to the build's inbox at rate per second from
// soakWorkers goroutines, each one at a time.
func (b *soakBuild) feed(ctx context.Context, rate float64) {
	handle := b.in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.UUID
		}
		if _, err := tx.Exec(ctx, `INSERT INTO soak_applied (message_id) SELECT unnest($1::text[])`, ids); err != nil {
			return err
		}
		out := make([]*message.Message, len(msgs))
		for i, m := range msgs {
			out[i] = outbox.NewMessage(fmt.Sprint("key-", m.UUID[len(m.UUID)-2:]), []byte(`{"v":1}`))
		}
		return outbox.PublishTx(ctx, tx, "soak", out...)
	})
	// Each offer carries when it was due: a delivery's latency runs from
	// then, so time spent waiting for a free worker counts.
	tokens := make(chan time.Time, soakWorkers)
	go func() {
		every := time.Duration(float64(time.Second) / rate)
		next := time.Now()
		for ctx.Err() == nil {
			next = next.Add(every)
			time.Sleep(time.Until(next)) // paced by the clock, not by the workers
			select {
			case tokens <- next:
			default: // the workers are behind: counted, and the rate applied shows it
				b.mu.Lock()
				b.dropped++
				b.mu.Unlock()
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var recent []string
			for {
				var due time.Time
				select {
				case <-ctx.Done():
					return
				case due = <-tokens:
				}
				id := uuid.Must(uuid.NewV7()).String()
				if len(recent) > 0 && rng.IntN(100) == 0 {
					id = recent[rng.IntN(len(recent))] // a copy: suppressed
				} else {
					recent = append(recent, id)
					if len(recent) > 1000 {
						recent = recent[500:]
					}
				}
				msg := message.NewMessage(id, []byte(`{"v":1}`))
				msg.SetContext(ctx)
				err := handle(msg)
				took := time.Since(due)
				b.mu.Lock()
				if err != nil {
					if ctx.Err() == nil {
						b.errors++
					}
				} else {
					b.applied++
					b.total++
					b.latencies = append(b.latencies, took)
				}
				b.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// sweep runs the inbox's retention and the relay's every soakSweepEvery,
// as their Runs would, counting what the inbox deleted and what failed.
func (b *soakBuild) sweep(ctx context.Context, say func(string, ...any)) {
	t := time.NewTicker(soakSweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := b.in.Sweep(ctx)
		if b.name == "partitions" {
			_, rerr := b.relay.RetirePartitions(ctx)
			err = errors.Join(err, rerr)
		} else {
			_, rerr := b.relay.DeletePublished(ctx)
			err = errors.Join(err, rerr)
		}
		failed := err != nil && ctx.Err() == nil
		if failed {
			say("soak %s: sweep: %v", b.name, err)
		}
		b.mu.Lock()
		b.swept += n
		if failed {
			b.sweepErrs++
		}
		b.mu.Unlock()
	}
}

// take closes the build's sample interval.
func (b *soakBuild) take(ctx context.Context, elapsed, sample time.Duration, phase string) (SoakSample, error) {
	b.mu.Lock()
	lat, applied := b.latencies, b.applied
	b.latencies, b.applied = nil, 0
	b.mu.Unlock()
	slices.Sort(lat)
	s := SoakSample{AtS: elapsed.Round(time.Second).Seconds(), Phase: phase, AppliedPS: float64(applied) / sample.Seconds(),
		P50Ms: ms(quantile(lat, 0.50)), P99Ms: ms(quantile(lat, 0.99))}
	var bytes, outboxBytes int64
	const table = `
		SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint,
			coalesce(sum(s.n_live_tup), 0)::bigint, coalesce(sum(s.n_dead_tup), 0)::bigint,
			count(*) FILTER (WHERE c.relname LIKE replace($1, '_', '\_') || '\_p%')::int
		FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE c.relkind = 'r' AND (c.relname = $1 OR c.relname LIKE replace($1, '_', '\_') || '\_%')`
	err := b.pool.QueryRow(ctx, table, "inbox_messages").Scan(&bytes, &s.LiveTuples, &s.DeadTuples, &s.Partitions)
	if err == nil {
		err = b.pool.QueryRow(ctx, table, "outbox_messages").Scan(&outboxBytes, &s.OutboxLive, &s.OutboxDead, &s.OutboxPartitions)
	}
	s.TableMB = float64(bytes) / (1 << 20)
	s.OutboxMB = float64(outboxBytes) / (1 << 20)
	return s, err
}

// soakPublisher is the relay's publisher in the soak: it acknowledges
// every message at once.
type soakPublisher struct{}

func (soakPublisher) Publish(string, ...*message.Message) error { return nil }
func (soakPublisher) Close() error                              { return nil }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// soakPhases sums up samples by phase.
func soakPhases(samples []SoakSample) map[string]SoakPhase {
	out := map[string]SoakPhase{}
	for _, phase := range []string{"before", "long_tx", "after"} {
		var tput, p99 []float64
		var sp SoakPhase
		for _, s := range samples {
			if s.Phase != phase {
				continue
			}
			tput, p99 = append(tput, s.AppliedPS), append(p99, s.P99Ms)
			sp.MaxDead = max(sp.MaxDead, s.DeadTuples)
			sp.MaxMB = max(sp.MaxMB, s.TableMB)
			sp.OutboxMaxDead = max(sp.OutboxMaxDead, s.OutboxDead)
			sp.OutboxMaxMB = max(sp.OutboxMaxMB, s.OutboxMB)
		}
		if len(tput) == 0 {
			continue
		}
		sp.AppliedPS, sp.P99Ms = median(tput), median(p99)
		out[phase] = sp
	}
	return out
}
