package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/services/events"
)

// database is what the service builds run on: one throwaway server
// (pgtest.Server) or a replicated cluster (stack.PatroniCluster, the
// replicated benchmark).
type database interface {
	system.Postgres
	DropDatabase(ctx context.Context, name string) error
}

// runServices measures one build of the two services, run as processes.
func runServices(ctx context.Context, pg database, p params, round int, b build, env []string, latency bool, say func(string, ...any)) (Result, error) {
	res := Result{Build: b.name, Env: env}
	prefix := fmt.Sprintf("bench_%s_%s_r%d_", b.name, b.kafka, round)
	defer dropDatabases(pg, prefix+"orders", prefix+"inventory", prefix+"provider", prefix+"audit") // runs after sys.Stop
	sys, err := system.Start(ctx, system.Options{
		Postgres: pg, DBPrefix: prefix,
		Env: append([]string{"LOG_LEVEL=warn", "DEBUG_PPROF=true"}, env...),
		// A fresh broker per build, as for kfake: a single Apache node.
		Kafka: stack.KafkaOptions{Partitions: p.Partitions, Impl: b.kafka, Nodes: 1},
		// Unsigned but for project_signed: the textbook relay (Watermill's
		// Forwarder) cannot sign, and the comparisons are of the relays
		// alone (no auditor reading beside them either); project_signed
		// prices what the demo, compose and the proof run.
		Unsigned: !b.signed, WithoutAuditor: true,
	})
	if err != nil {
		return res, err
	}
	defer sys.Stop()
	res.Kafka = sys.Kafka.Describe()
	name := b.key()
	var brokerPids []int
	if apache := sys.Kafka.Apache(); apache != nil {
		for _, n := range apache.Nodes() {
			brokerPids = append(brokerPids, n.Pid())
		}
	}
	orders, inventory := sys.Pools["orders"], sys.Pools["inventory"]

	rng := rand.New(rand.NewPCG(p.Seed, 1))
	skus := loadgen.SKUs(p.SKUs)
	stock := map[string]int{}
	for _, s := range skus {
		stock[s] = 1 << 30
	}
	if err := sys.Client.SeedStock(ctx, stock); err != nil {
		return res, err
	}
	if b.history > 0 {
		say("%s: writing %d rows of history into each service's inbox and outbox (history.go)", b.key(), b.history)
		res.History = &History{RowsPerTable: b.history}
		if res.History.FillSeconds, err = fillHistory(ctx, sys.Pools, b.history, say); err != nil {
			return res, err
		}
	}
	latencyOrders := int(p.LatencyRate * p.LatencyFor)
	warmOrders := int(p.LatencyRate * p.WarmFor) // at the latency phase's rate
	ids, err := createOrders(ctx, orders, warmOrders+latencyOrders+p.Orders, rng, skus)
	if err != nil {
		return res, err
	}
	settled := 0 // orders settled so far

	pids := func() []int {
		var out []int
		for _, proc := range sys.All() {
			out = append(out, proc.Pid())
		}
		return out
	}

	// Latency first, on a system that is warm but not still digesting the
	// saturation phase's backlog: a fixed offered rate, each hop timed. A
	// build that measures no latency is paid the same orders at the same
	// rate, untimed, so that every build's saturation phase starts from a
	// system as warm (a fresh broker JVM has compiled its hot paths) and
	// tables as full as the others': without it, the dedupe-off build met
	// the saturation phase with a broker still compiling, and came out the
	// slower one on Apache Kafka.
	warm, measured := ids[:warmOrders], ids[warmOrders:warmOrders+latencyOrders]
	if !latency {
		warm, measured = ids[:warmOrders+latencyOrders], nil
	}
	ticker := time.NewTicker(time.Duration(float64(time.Second) / p.LatencyRate))
	err = payAll(ctx, sys.Client, warm, 64, ticker.C)
	ticker.Stop()
	if err != nil {
		return res, err
	}
	settled += len(warm)
	if _, err := waitSettled(ctx, orders, settled, time.Minute); err != nil {
		return res, err
	}
	if latency {
		if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
			go profile(ctx, sys, dir, name+"-latency", say)
		}
		if *statements {
			resetStatements(ctx, orders, say)
		}
		cpu0, t0 := cpuSeconds(pids(), brokerPids), time.Now()
		lat, missing, err := measureLatency(ctx, sys.Client, inventory, sys.DBURL["inventory"], measured, p.LatencyRate)
		if err != nil {
			return res, err
		}
		use, secs := cpuSeconds(pids(), brokerPids).sub(cpu0), time.Since(t0).Seconds()
		res.LatencyCoresBusy = use.total() / secs
		res.LatencyCores = use.scaled(1 / secs)
		if *statements {
			say("statements of the latency phase:")
			printStatements(ctx, orders, latencyOrders, say)
		}
		if *splitHops {
			printHops(ctx, orders, inventory, measured, say)
		}
		res.HopLatencyMS, res.LatencySamples, res.LatencyMissing = lat, latencyOrders-missing, missing
		settled += len(measured)
		if _, err := waitSettled(ctx, orders, settled, time.Minute); err != nil {
			return res, err
		}
	}
	ids = ids[warmOrders+latencyOrders:]

	// Saturation: every order paid as fast as Payers clients can, until every
	// one is settled.
	cpu0 := cpuSeconds(pids(), brokerPids)
	tx0, err := xacts(ctx, orders, sys.DBURL)
	if err != nil {
		return res, err
	}
	if *statements {
		resetStatements(ctx, orders, say)
	}
	t0 := time.Now()
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		go profile(ctx, sys, dir, name, say)
	}
	if err := payAll(ctx, sys.Client, ids, p.Payers, nil); err != nil {
		return res, err
	}
	say("%s: all %d orders paid after %s", name, p.Orders, time.Since(t0).Round(time.Millisecond))
	polls, err := waitSettled(ctx, orders, settled+p.Orders, 5*time.Minute)
	if err != nil {
		return res, err
	}
	elapsed := time.Since(t0)
	cpu1 := cpuSeconds(pids(), brokerPids)
	time.Sleep(1500 * time.Millisecond) // Postgres publishes transaction counts about once a second
	tx1, err := xacts(ctx, orders, sys.DBURL)
	if err != nil {
		return res, err
	}
	res.SaturationS = elapsed.Seconds()
	res.RoundTripsPerS = float64(p.Orders) / elapsed.Seconds()
	res.DBTxPerMessage = float64(tx1-tx0-polls-2) / float64(2*p.Orders) // minus the bench's own polls and reads
	res.CPU = cpu1.sub(cpu0).per1000(p.Orders)
	res.CPUSPer1000 = res.CPU.total()
	say("%s: %d round trips in %s", name, p.Orders, elapsed.Round(time.Millisecond))
	if *statements {
		printStatements(ctx, orders, p.Orders, say)
	}
	if !latency {
		res.Notes = "saturation only"
	}
	if res.History != nil {
		if res.History.Sweeps, err = sweepHistory(ctx, sys.Pools); err != nil {
			return res, err
		}
	}
	return res, nil
}

// createOrders inserts n unpaid orders of 1-3 random lines.
func createOrders(ctx context.Context, pool *pgxpool.Pool, n int, rng *rand.Rand, skus []string) ([]string, error) {
	ids := make([]string, n)
	lines := make([]string, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
		b, _ := events.Encode(loadgen.Lines(rng, skus))
		lines[i] = string(b)
	}
	_, err := pool.Exec(ctx, `INSERT INTO orders (id, lines) SELECT * FROM unnest($1::uuid[], $2::jsonb[])`, ids, lines)
	return ids, err
}

// payAll pays ids through the orders service's API with n concurrent
// clients; when tick is set, each payment waits for a tick first (a fixed
// offered rate), and committed receives, for each order, the time its
// payment was answered, which is just after its commit.
func payAll(ctx context.Context, client *loadgen.Client, ids []string, n int, tick <-chan time.Time, committed ...func(string, time.Time)) error {
	work := make(chan string)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				if _, err := client.Pay(ctx, id); err != nil {
					errs <- fmt.Errorf("paying %s: %w", id, err)
					return
				}
				for _, f := range committed {
					f(id, time.Now())
				}
			}
		}()
	}
	var err error
feed:
	for _, id := range ids {
		if tick != nil {
			<-tick
		}
		select {
		case work <- id:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// waitSettled polls until n orders are reserved or rejected; it returns how
// many polls (database transactions of the bench's own) it took. A poll is a
// sequential scan of orders, so between polls it waits half the time the rest
// should take at the pace seen so far (20 to 500ms): a handful of polls per
// phase instead of one every 20ms, closing in on the finish.
func waitSettled(ctx context.Context, pool *pgxpool.Pool, n int, timeout time.Duration) (int64, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	var polls int64
	first := -1
	for {
		var settled int
		polls++
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status IN ('reserved', 'rejected')`).Scan(&settled); err != nil {
			return polls, err
		}
		if settled >= n {
			return polls, nil
		}
		if time.Now().After(deadline) {
			return polls, fmt.Errorf("only %d of %d round trips completed within %s", settled, n, timeout)
		}
		wait := 20 * time.Millisecond
		if first < 0 {
			first = settled
		} else if done := settled - first; done > 0 {
			perOrder := time.Since(start) / time.Duration(done)
			wait = max(wait, min(perOrder*time.Duration(n-settled)/2, 500*time.Millisecond))
		}
		time.Sleep(wait)
	}
}

// xacts sums committed and rolled-back transactions of the build's two
// databases.
func xacts(ctx context.Context, pool *pgxpool.Pool, urls map[string]string) (int64, error) {
	var names []string
	for _, u := range urls {
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			return 0, err
		}
		names = append(names, cfg.Database)
	}
	var n int64
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1)`, names).Scan(&n)
	return n, err
}

// measureLatency pays ids at rate per second and times each hop from the
// payment's commit to the commit of inventory's reservation, which a trigger
// announces with NOTIFY (delivered at commit).
func measureLatency(ctx context.Context, client *loadgen.Client, inventory *pgxpool.Pool, inventoryURL string, ids []string, rate float64) (Percentiles, int, error) {
	if _, err := inventory.Exec(ctx, `
		CREATE OR REPLACE FUNCTION bench_hop() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN PERFORM pg_notify('bench_hop', NEW.order_id); RETURN NULL; END $$;
		CREATE OR REPLACE TRIGGER bench_hop AFTER INSERT ON reservations FOR EACH ROW EXECUTE FUNCTION bench_hop();`); err != nil {
		return Percentiles{}, 0, fmt.Errorf("installing the latency trigger: %w", err)
	}
	conn, err := pgx.Connect(ctx, inventoryURL)
	if err != nil {
		return Percentiles{}, 0, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN bench_hop"); err != nil {
		return Percentiles{}, 0, err
	}
	var mu sync.Mutex
	committed := map[string]time.Time{}
	applied := map[string]time.Time{}
	var got atomic.Int64
	listenCtx, stopListening := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(listenCtx)
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			if _, seen := applied[n.Payload]; !seen {
				applied[n.Payload] = now
				got.Add(1)
			}
			mu.Unlock()
		}
	}()
	ticker := time.NewTicker(time.Duration(float64(time.Second) / rate))
	err = payAll(ctx, client, ids, 64, ticker.C, func(id string, t time.Time) {
		mu.Lock()
		committed[id] = t
		mu.Unlock()
	})
	ticker.Stop()
	if err != nil {
		stopListening()
		return Percentiles{}, 0, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for got.Load() < int64(len(ids)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stopListening()
	<-done
	// The saturation phase runs without the trigger, like the builds that
	// measure no latency.
	if _, err := inventory.Exec(ctx, `DROP TRIGGER bench_hop ON reservations`); err != nil {
		return Percentiles{}, 0, err
	}
	var hops []float64
	for id, c := range committed {
		if a, ok := applied[id]; ok {
			hops = append(hops, float64(a.Sub(c).Microseconds())/1000)
		}
	}
	if len(hops) == 0 {
		return Percentiles{}, len(ids), errors.New("no hop was observed")
	}
	return percentiles(hops), len(ids) - len(hops), nil
}

func percentiles(v []float64) Percentiles {
	sort.Float64s(v)
	at := func(q float64) float64 { return v[min(len(v)-1, int(q*float64(len(v))))] }
	return Percentiles{P50: at(0.50), P95: at(0.95), P99: at(0.99)}
}

// profile saves a 5-second CPU profile of every service process, taken 2s
// into the latency phase and again into the saturation phase
// (BENCH_PROFILE_DIR; for working on speed).
func profile(ctx context.Context, sys *system.System, dir, build string, say func(string, ...any)) {
	time.Sleep(2 * time.Second)
	var wg sync.WaitGroup
	for _, p := range sys.All() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr+"/debug/pprof/profile?seconds=5", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				say("profiling %s: %v", p.Name, err)
				return
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			path := filepath.Join(dir, build+"-"+p.Name+".pprof")
			if err := os.WriteFile(path, data, 0o644); err == nil {
				say("profile of %s: %s", p.Name, path)
			}
		}()
	}
	wg.Wait()
}

// statements, for working on speed, prints where Postgres's time went in
// each build's saturation phase. It needs pg_stat_statements loaded (and
// track_planning on for the planning times):
//
//	STACK_POSTGRES_CONF="shared_preload_libraries = 'pg_stat_statements'" go run ./bench -statements
var statements = flag.Bool("statements", false, "print the top statements by total time per build (needs pg_stat_statements, see bench/services.go)")

func resetStatements(ctx context.Context, pool *pgxpool.Pool, say func(string, ...any)) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()`); err != nil {
		say("statements: %v", err)
	}
}

func printStatements(ctx context.Context, pool *pgxpool.Pool, roundTrips int, say func(string, ...any)) {
	rows, err := pool.Query(ctx, `
		SELECT calls, total_exec_time, total_plan_time, max_exec_time, rows, wal_bytes, regexp_replace(left(query, 100), '\s+', ' ', 'g')
		FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25`)
	if err != nil {
		say("statements: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var calls, n int64
		var ms, planMS, maxMS, wal float64
		var q string
		if err := rows.Scan(&calls, &ms, &planMS, &maxMS, &n, &wal, &q); err != nil {
			say("statements: %v", err)
			return
		}
		say("  %7d calls %6.3f/rt %8.1f ms (max %6.1f) planned %6.1f ms %7d rows %6.0f WAL B/rt  %s",
			calls, float64(calls)/float64(roundTrips), ms, maxMS, planMS, n, wal/float64(roundTrips), q)
	}
}

// splitHops, for working on latency, splits the latency phase's hops into their
// stages by the transactions' start times (now() in Postgres): payment →
// relay batch that claimed its OrderPaid → inventory batch that applied it.
var splitHops = flag.Bool("hops", false, "print where the latency phase's hops spent their time")

func printHops(ctx context.Context, orders, inventory *pgxpool.Pool, ids []string, say func(string, ...any)) {
	type stamps struct{ paid, claimed, applied time.Time }
	at := map[string]*stamps{}
	rows, err := orders.Query(ctx, `SELECT partition_key, created_at, published_at FROM outbox_messages
		WHERE partition_key = ANY($1) AND published_at IS NOT NULL AND `+events.OutboxType+` = $2`, ids, events.TypeOrderPaid)
	if err != nil {
		say("hops: %v", err)
		return
	}
	var id string
	var a, b time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &a, &b}, func() error { at[id] = &stamps{paid: a, claimed: b}; return nil })
	if err == nil {
		rows, err = inventory.Query(ctx, `SELECT order_id, min(created_at) FROM reservations WHERE order_id = ANY($1) GROUP BY order_id
			UNION ALL SELECT order_id, min(created_at) FROM rejections WHERE order_id = ANY($1) GROUP BY order_id`, ids)
	}
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&id, &a}, func() error {
			if s := at[id]; s != nil {
				s.applied = a
			}
			return nil
		})
	}
	if err != nil {
		say("hops: %v", err)
		return
	}
	var toClaim, toApply []float64
	for _, s := range at {
		if !s.applied.IsZero() {
			toClaim = append(toClaim, float64(s.claimed.Sub(s.paid).Microseconds())/1000)
			toApply = append(toApply, float64(s.applied.Sub(s.claimed).Microseconds())/1000)
		}
	}
	if len(toClaim) == 0 {
		return
	}
	c, p := percentiles(toClaim), percentiles(toApply)
	say("hops by transaction start: payment → relay claim p50/p95/p99 %.1f/%.1f/%.1f ms; relay claim → inventory batch %.1f/%.1f/%.1f ms",
		c.P50, c.P95, c.P99, p.P50, p.P95, p.P99)
}

// dropDatabases drops a build's databases once it is done, so every round
// starts on empty tables and the disk does not fill up over rounds.
func dropDatabases(pg database, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range names {
		if err := pg.DropDatabase(ctx, name); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}
}
