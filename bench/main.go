// Command bench measures what the pattern costs, side by side in one run on
// one machine: the same order round trips (OrderPaid committed in orders →
// reservation committed in inventory → InventoryReserved applied in orders)
// against
//
//   - textbook: the shape the well-known articles show: a transaction per
//     payment and per consumed message (API_BATCH_SIZE=1,
//     INBOX_BATCH_SIZE=1), and watermill-sql's polling subscriber with its
//     default settings relaying the outbox, one synchronous Kafka send per
//     message (RELAY_DRIVER=textbook);
//   - project:  the default configuration users get: payments that arrive
//     together commit together, consumed messages that arrive together are
//     applied by one set-based transaction, the batching relay;
//   - project, dedupe off: the same, with the inbox's INSERT switched off,
//     to price the inbox itself;
//   - limit:    the same SQL statements replayed straight against Postgres in
//     batches, with no Kafka and no Go services in between.
//
// The three service builds run on the embedded fake broker (kfake) and, where
// Java runs, again on real Apache Kafka (one node, a JVM from Maven Central's
// jars), in the same rounds: the report puts the two side by side, so what
// the fake flattered or hid is a ratio measured in one run (-kafka).
//
// Speed claims are the ratios between these, measured in the same run.
// It writes bench-report.json (BENCH_REPORT overrides the path) and an SVG
// chart next to it.
//
//	go run ./bench            # make bench
//	go run ./bench -smoke     # seconds; what CI runs
//	go run ./bench -kafka kfake   # without the real-Kafka builds
//	go run ./bench -replicated    # one Postgres node against three under Patroni (bench/replicated.go)
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/progress"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench: FAIL:", err)
		os.Exit(1)
	}
}

// params sizes a run; every build gets the same.
type params struct {
	Orders      int     `json:"orders"`       // round trips in the saturation phase
	Payers      int     `json:"payers"`       // concurrent paying clients
	SKUs        int     `json:"skus"`         // catalogue size (large: little lock contention)
	Partitions  int     `json:"partitions"`   // per topic
	LatencyRate float64 `json:"latency_rate"` // orders/s offered in the latency phase
	LatencyFor  float64 `json:"latency_s"`    // seconds of the latency phase
	WarmFor     float64 `json:"warmup_s"`     // seconds at the latency phase's rate before it is measured
	LimitBatch  int     `json:"limit_batch"`  // orders per transaction in the limit build
	History     int     `json:"history_rows"` // rows per table the history build starts with (0: no history build)
	Rounds      int     `json:"rounds"`       // each build runs this often, alternating; figures are medians
	Seed        uint64  `json:"seed"`
}

// Result is one build's figures.
type Result struct {
	Build          string      `json:"build"`
	Kafka          string      `json:"kafka,omitempty"` // the broker it ran on; none for limit
	RoundTripsPerS float64     `json:"round_trips_per_s"`
	HopLatencyMS   Percentiles `json:"hop_latency_ms"`
	DBTxPerMessage float64     `json:"db_tx_per_message"`
	CPUSPer1000    float64     `json:"cpu_s_per_1000_round_trips"`
	CPU            cpuUse      `json:"cpu_s_per_1000_by_process"`
	SaturationS    float64     `json:"saturation_s"`
	LatencySamples int         `json:"latency_samples"`
	LatencyMissing int         `json:"latency_missing"`
	// LatencyCoresBusy is the CPU the measured processes used during the
	// latency phase, in cores (the machine has Machine["cpus"]): how close
	// to saturation the fixed offered load runs it.
	LatencyCoresBusy float64 `json:"latency_phase_cores_busy"`
	// LatencyCores splits LatencyCoresBusy by component, in cores.
	LatencyCores cpuUse   `json:"latency_phase_cores"`
	Env          []string `json:"env,omitempty"`
	Notes        string   `json:"notes,omitempty"`
	// PerRound is each round's round trips/s, in order; the figures above
	// are the medians over rounds, field by field.
	PerRound []float64 `json:"round_trips_per_s_by_round,omitempty"`
	// History is the history build's fill and sweeps (history.go), of its
	// last round.
	History *History `json:"history,omitempty"`
}

// Percentiles of one-hop latency, producer commit → consumer commit.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Side is the service builds' figures on one broker, with the ratios and
// goals judged from them.
type Side struct {
	Kafka         string               `json:"kafka"`
	Textbook      Result               `json:"textbook"`
	Project       Result               `json:"project"`
	ProjectNoDup  Result               `json:"project_dedupe_off"`
	Signed        Result               `json:"project_signed"`  // the project build signing and verifying, as the demo runs
	History       Result               `json:"project_history"` // the project build on tables holding history (-history)
	Ratios        map[string]float64   `json:"ratios"`          // medians of each round's ratios
	RatiosByRound []map[string]float64 `json:"ratios_by_round"`
	Goals         map[string]bool      `json:"goals"`
	unjudged      []string
}

// Report is bench-report.json. The builds on kfake sit at the top level
// (the Side is inlined), those on real Kafka under real_kafka.
type Report struct {
	When    string            `json:"when"`
	Machine map[string]string `json:"machine"`
	Params  params            `json:"params"`
	Side
	Limit Result `json:"limit"`
	// RealKafka is the same service builds on Apache Kafka, when run.
	RealKafka *Side `json:"real_kafka,omitempty"`
	// RealVsFake divides real Kafka's figures by kfake's (medians of each
	// round's ratio for round trips/s): below 1, the fake flattered.
	RealVsFake    map[string]float64 `json:"real_vs_fake,omitempty"`
	RealKafkaSkip string             `json:"real_kafka_skipped,omitempty"`
	Chart         string             `json:"chart"`
}

// build is one configuration the benchmark measures.
type build struct {
	name    string   // textbook, project, project_signed, project_dedupe_off, project_history, limit
	env     []string // the services' extra environment
	signed  bool     // each service signs what it publishes and verifies what it consumes
	kafka   string   // stack.ImplKfake or stack.ImplApache; "" for limit
	history int      // rows per table written before the load (history.go)
}

// key names a build's rounds: the real-Kafka builds get "@apache".
func (b build) key() string {
	if b.kafka == stack.ImplApache {
		return b.name + "@apache"
	}
	return b.name
}

func run(ctx context.Context) error {
	smoke := flag.Bool("smoke", false, "a few seconds per build: checks the benchmark works, measures nothing")
	only := flag.String("only", "", "run only these builds (comma-separated), for working on one; the report is then partial")
	orders := flag.Int("orders", 0, "override the number of round trips in the saturation phase")
	partitions := flag.Int("partitions", 0, "override the number of partitions per topic")
	rounds := flag.Int("rounds", 3, "run every build this many times, alternating, and report medians: the machine's noise hits each build alike")
	limitBatch := flag.Int("limit-batch", 0, "override the orders per transaction of the limit build (100), to see what batch size alone is worth")
	warmup := flag.Duration("warmup", time.Second, "how long the latency phase's rate runs before it is measured: a fresh broker JVM compiles its hot paths in its first tens of seconds")
	rate := flag.Float64("rate", 0, "override the offered load of the latency phase (orders/s; the goal is stated at 500)")
	extraEnv := flag.String("env", "", "extra environment for the services of every build, comma-separated KEY=VALUE (for trying a setting; the report records it)")
	relayOnly := flag.Bool("relay", false, "run the relay-only benchmark instead (bench/relay.go): Watermill's Forwarder at its defaults and tuned, this relay with 1, 2 and 3 replicas; writes bench-relay-report.json (BENCH_RELAY_REPORT)")
	faults := flag.Bool("faults", false, "run the faults benchmark instead (bench/faults.go): the relay at a steady rate on a 3-node Apache Kafka cluster while a broker is SIGKILLed and its partitions' leaders change; writes bench-faults-report.json (BENCH_FAULTS_REPORT)")
	soak := flag.Duration("soak", 0, "run the soak instead (bench/soak.go): an inbox and an outbox retiring rows by DELETE beside a pair dropping partitions, at a steady rate (-rate, default 200/s) for this long, with a transaction held open in the middle third; writes bench-soak-report.json (BENCH_SOAK_REPORT); 20m for the goal")
	history := flag.Int("history", 0, "add the history build: the project build on tables that already hold this many rows each (both services' inbox and outbox; history.go), beside the empty-table figures; 10000000 for the goal")
	replicated := flag.Bool("replicated", false, "run the replicated benchmark instead (bench/replicated.go): the project build on one Postgres node and on three under Patroni, asynchronous, synchronous and asynchronous with DATABASE_STANDBYS=1 (needs Patroni and etcd, as make failover); writes bench-replicated-report.json (BENCH_REPLICATED_REPORT)")
	kafkaFlag := flag.String("kafka", "", "brokers to run the service builds on, comma-separated: kfake, apache (one node). Default: both, or kfake alone (said so in the report) where Apache Kafka cannot run; with REQUIRE_APACHE_KAFKA set, that is an error")
	flag.Parse()
	p := params{Orders: 20_000, Payers: 32, SKUs: 500, Partitions: 32, LatencyRate: 500, LatencyFor: 8, LimitBatch: 100, Seed: 1}
	p.Rounds = max(1, *rounds)
	p.History = *history
	if *smoke {
		p.Orders, p.LatencyFor, p.Rounds = 500, 1, 1
		p.History = cmp.Or(p.History, 20_000)
	}
	if *orders > 0 {
		p.Orders = *orders
	}
	if *partitions > 0 {
		p.Partitions = *partitions
	}
	if *rate > 0 {
		p.LatencyRate = *rate
	}
	if *limitBatch > 0 {
		p.LimitBatch = *limitBatch
	}
	p.WarmFor = warmup.Seconds()
	// The signed build goes with the project build: what users run, beside
	// what the comparisons measure.
	want := func(build string) bool {
		has := func(name string) bool { return strings.Contains(","+*only+",", ","+name+",") }
		return *only == "" || has(build) || has(strings.TrimSuffix(build, "_signed"))
	}
	path := os.Getenv("BENCH_REPORT")
	if path == "" {
		path = "bench-report.json"
	}

	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	if *relayOnly {
		return runRelayBench(ctx, *smoke, *kafkaFlag, *rounds, say)
	}
	if *faults {
		return runFaultBench(ctx, *smoke, *rounds, say)
	}
	if *soak > 0 {
		sample := 15 * time.Second
		if *smoke {
			sample = 2 * time.Second
		}
		return runSoak(ctx, *soak, cmp.Or(*rate, 200), sample, say)
	}
	if *replicated {
		return runReplicatedBench(ctx, p, *smoke, say)
	}
	r := Report{When: time.Now().UTC().Format(time.RFC3339), Params: p, Machine: machine()}
	brokers, skipped, err := chooseBrokers(ctx, *kafkaFlag, say)
	if err != nil {
		return err
	}
	r.RealKafkaSkip = skipped

	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck

	say("params: %+v, brokers %v", p, brokers)
	var builds []build
	for _, kafka := range brokers {
		if *smoke && kafka == stack.ImplApache {
			// The smoke keeps the real-Kafka path working with one build:
			// the others differ from their kfake runs only in the broker.
			builds = append(builds, build{name: "project", kafka: kafka})
			continue
		}
		builds = append(builds,
			build{name: "textbook", env: []string{"RELAY_DRIVER=textbook", "INBOX_BATCH_SIZE=1", "API_BATCH_SIZE=1"}, kafka: kafka},
			build{name: "project", kafka: kafka},
			build{name: "project_signed", signed: true, kafka: kafka},
			build{name: "project_dedupe_off", env: []string{"INBOX_DISABLED=true"}, kafka: kafka})
		if p.History > 0 {
			builds = append(builds, build{name: "project_history", env: historyEnv, kafka: kafka, history: p.History})
		}
	}
	builds = append(builds, build{name: "limit"})
	// Every build runs once per round, so a noisy spell of the shared
	// machine lands on all of them alike; each round's ratios compare builds
	// measured minutes apart.
	byBuild := map[string][]Result{}
	steps, step := 0, 0 // runs of a build, for the progress lines
	for _, b := range builds {
		if want(b.name) {
			steps += p.Rounds
		}
	}
	started := time.Now()
	for round := 1; round <= p.Rounds; round++ {
		for _, b := range builds {
			if !want(b.name) {
				continue
			}
			at := fmt.Sprintf("[step %d of %d%s]", step+1, steps, progress.Left(step, steps, time.Since(started)))
			step++
			var res Result
			var err error
			if b.name == "limit" {
				say("== %s limit, round %d/%d (batched SQL, no Kafka, no services)", at, round, p.Rounds)
				res, err = runLimit(ctx, pg, p, round, say)
			} else {
				env := b.env
				if *extraEnv != "" {
					env = append(env, strings.Split(*extraEnv, ",")...)
				}
				say("== %s %s, round %d/%d %v", at, b.key(), round, p.Rounds, env)
				res, err = runServices(ctx, pg, p, round, b, env, b.name != "project_dedupe_off", say)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", b.key(), err)
			}
			lc := res.LatencyCores
			say("%s: %.0f round trips/s, hop p50/p95/p99 %.1f/%.1f/%.1f ms (%.2f cores busy at %.0f/s: postgres %.2f, services %.2f, bench %.2f, broker JVM %.2f), %.2f db tx/message, %.2f CPU s/1000 (postgres %.2f, services %.2f, bench %.2f, broker JVM %.2f)",
				b.key(), res.RoundTripsPerS, res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, res.LatencyCoresBusy, p.LatencyRate,
				lc.Postgres, lc.Services, lc.Bench, lc.Broker,
				res.DBTxPerMessage, res.CPUSPer1000, res.CPU.Postgres, res.CPU.Services, res.CPU.Bench, res.CPU.Broker)
			byBuild[b.key()] = append(byBuild[b.key()], res)
		}
	}
	if rs := byBuild["limit"]; len(rs) > 0 {
		r.Limit = medianResult(rs)
	}
	for _, kafka := range brokers {
		side := judge(kafka, byBuild, p)
		if kafka == stack.ImplApache {
			r.RealKafka = &side
		} else {
			r.Side = side
		}
	}
	if r.RealKafka != nil && slices.Contains(brokers, stack.ImplKfake) {
		r.RealVsFake = realVsFake(byBuild, r.Side, *r.RealKafka, p.Rounds)
	}

	r.Chart = strings.TrimSuffix(path, filepath.Ext(path)) + ".svg"
	if err := os.WriteFile(r.Chart, chart(r), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return err
	}
	printReport(r)
	fmt.Printf("\nwrote %s and %s\n", path, r.Chart)
	if *smoke {
		fmt.Println("(smoke run: the figures above measure nothing)")
	}
	return nil
}

// chooseBrokers reads -kafka. Left empty, it runs real Kafka beside kfake
// where it can, and otherwise returns why not.
func chooseBrokers(ctx context.Context, flagValue string, say func(string, ...any)) (brokers []string, skipped string, err error) {
	if flagValue == "" {
		if _, _, err := stack.ApacheRuntime(ctx, say); err != nil {
			if os.Getenv("REQUIRE_APACHE_KAFKA") != "" {
				return nil, "", fmt.Errorf("REQUIRE_APACHE_KAFKA is set: %w", err)
			}
			say("real Kafka: skipped, the builds run on kfake alone: %v", err)
			return []string{stack.ImplKfake}, err.Error(), nil
		}
		return []string{stack.ImplKfake, stack.ImplApache}, "", nil
	}
	for _, b := range strings.Split(flagValue, ",") {
		b = strings.TrimSpace(b)
		if b != stack.ImplKfake && b != stack.ImplApache {
			return nil, "", fmt.Errorf("-kafka %q: want kfake, apache or both, comma-separated", flagValue)
		}
		if !slices.Contains(brokers, b) {
			brokers = append(brokers, b)
		}
	}
	return brokers, "", nil
}

// judge gathers one broker's service builds, their ratios by round and the
// goals. A goal is judged only when this run measured what it needs: a build
// left out with -only, or a latency phase at another rate, leaves it
// unjudged instead of passing it on a zero.
func judge(kafka string, byBuild map[string][]Result, p params) Side {
	key := build{kafka: kafka}.key() // "" or "@apache"
	rounds := func(name string) []Result { return byBuild[name+key] }
	s := Side{Ratios: map[string]float64{}, Goals: map[string]bool{}}
	for _, f := range []struct {
		name string
		dst  *Result
	}{{"textbook", &s.Textbook}, {"project", &s.Project}, {"project_signed", &s.Signed}, {"project_dedupe_off", &s.ProjectNoDup}, {"project_history", &s.History}} {
		if rs := rounds(f.name); len(rs) > 0 {
			*f.dst = medianResult(rs)
			s.Kafka = rs[0].Kafka
		}
	}
	at := func(rs []Result, round int) float64 {
		if round < len(rs) {
			return rs[round].RoundTripsPerS
		}
		return 0
	}
	for round := range p.Rounds {
		project := at(rounds("project"), round)
		m := map[string]float64{
			"project_vs_textbook": ratio(project, at(rounds("textbook"), round)),
			"project_vs_limit":    ratio(project, at(byBuild["limit"], round)),
			"inbox_overhead":      overhead(project, at(rounds("project_dedupe_off"), round)),
		}
		if len(rounds("project_signed")) > 0 {
			m["signed_vs_project"] = ratio(at(rounds("project_signed"), round), project)
		}
		if len(rounds("project_history")) > 0 {
			m["history_vs_project"] = ratio(at(rounds("project_history"), round), project)
		}
		s.RatiosByRound = append(s.RatiosByRound, m)
	}
	for _, k := range []string{"project_vs_textbook", "project_vs_limit", "inbox_overhead", "signed_vs_project", "history_vs_project"} {
		if _, ok := s.RatiosByRound[0][k]; !ok {
			continue
		}
		var v []float64
		for _, m := range s.RatiosByRound {
			v = append(v, m[k])
		}
		s.Ratios[k] = median(v)
	}
	goal := func(goal string, measured, met bool) {
		if measured {
			s.Goals[goal] = met
		} else {
			s.unjudged = append(s.unjudged, goal)
		}
	}
	has := func(name string) bool { return len(rounds(name)) > 0 }
	goal("project >= 3x textbook", has("project") && has("textbook"), s.Ratios["project_vs_textbook"] >= 3)
	goal("project >= 40% of limit", has("project") && len(byBuild["limit"]) > 0, s.Ratios["project_vs_limit"] >= 0.4)
	goal("p99 hop <= 25ms at 500/s", has("project") && p.LatencyRate == 500, s.Project.HopLatencyMS.P99 <= 25)
	goal("inbox overhead <= 15%", has("project") && has("project_dedupe_off"), s.Ratios["inbox_overhead"] <= 0.15)
	goal("project >= 5000 round trips/s", has("project"), s.Project.RoundTripsPerS >= 5000)
	// With history: the same load on full tables, against the empty ones.
	if has("project_history") {
		s.Ratios["history_p99_vs_project"] = ratio(s.History.HopLatencyMS.P99, s.Project.HopLatencyMS.P99)
	}
	withHistory := has("project") && has("project_history") && p.History >= 10_000_000
	goal("history >= 90% of project", withHistory, s.Ratios["history_vs_project"] >= 0.9)
	goal("history p99 <= 1.5x project", withHistory, s.Ratios["history_p99_vs_project"] <= 1.5)
	return s
}

// realVsFake divides real Kafka's figures by kfake's: round trips/s as the
// median of each round's ratio (the two ran minutes apart), the rest from
// the medians.
func realVsFake(byBuild map[string][]Result, fake, real Side, rounds int) map[string]float64 {
	out := map[string]float64{}
	for _, name := range []string{"textbook", "project", "project_dedupe_off"} {
		var v []float64
		for round := range rounds {
			f, r := byBuild[name], byBuild[name+"@apache"]
			if round < len(f) && round < len(r) {
				v = append(v, ratio(r[round].RoundTripsPerS, f[round].RoundTripsPerS))
			}
		}
		if len(v) > 0 {
			out[name+"_round_trips"] = median(v)
		}
	}
	if fake.Project.LatencySamples > 0 && real.Project.LatencySamples > 0 {
		out["project_hop_p50"] = ratio(real.Project.HopLatencyMS.P50, fake.Project.HopLatencyMS.P50)
		out["project_hop_p99"] = ratio(real.Project.HopLatencyMS.P99, fake.Project.HopLatencyMS.P99)
	}
	if fake.Project.CPUSPer1000 > 0 {
		out["project_cpu_per_1000"] = ratio(real.Project.CPUSPer1000, fake.Project.CPUSPer1000)
	}
	if fake.Ratios["project_vs_textbook"] > 0 {
		out["project_vs_textbook"] = ratio(real.Ratios["project_vs_textbook"], fake.Ratios["project_vs_textbook"])
	}
	return out
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0 // a build left out with -only
	}
	return a / b
}

// overhead is what with costs against without, as a fraction of without's
// round trips/s.
func overhead(with, without float64) float64 {
	if with == 0 || without == 0 {
		return 0 // a build left out with -only
	}
	return 1 - with/without
}

// printReport prints the tables: one per broker, then real/fake.
func printReport(r Report) {
	sides := []*Side{&r.Side}
	if r.RealKafka != nil {
		sides = append(sides, r.RealKafka)
	}
	for _, s := range sides {
		if s.Kafka == "" && r.Limit.Build == "" {
			continue
		}
		fmt.Printf("\non %s:\n", cmp.Or(s.Kafka, "(no service build ran)"))
		fmt.Printf("%-20s %12s %9s %9s %9s %7s %10s %10s %10s\n", "build", "round trip/s", "p50 ms", "p95 ms", "p99 ms", "cores", "tx/msg", "CPU s/1k", "broker")
		for _, res := range []Result{s.Textbook, s.Project, s.ProjectNoDup, s.History, r.Limit} {
			if res.Build == "" {
				continue // left out with -only
			}
			fmt.Printf("%-20s %12.0f %9.1f %9.1f %9.1f %7.2f %10.2f %10.2f %10.2f\n", res.Build, res.RoundTripsPerS,
				res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, res.LatencyCoresBusy, res.DBTxPerMessage, res.CPUSPer1000, res.CPU.Broker)
		}
		if r.Params.Rounds > 1 {
			fmt.Printf("(medians of %d rounds; round trips/s by round:", r.Params.Rounds)
			for _, res := range []Result{s.Textbook, s.Project, s.ProjectNoDup, s.History, r.Limit} {
				if len(res.PerRound) > 0 {
					fmt.Printf(" %s %.0f", res.Build, res.PerRound)
				}
			}
			fmt.Println(")")
		}
		fmt.Printf("project/textbook %.2f×, project/limit %.0f%%, inbox overhead %.1f%%\n",
			s.Ratios["project_vs_textbook"], 100*s.Ratios["project_vs_limit"], 100*s.Ratios["inbox_overhead"])
		if h := s.History.History; h != nil {
			fmt.Printf("with %d rows of history per table (filled in %.0fs): %.0f%% of project's round trips/s, p99 %.2f× project's\n",
				h.RowsPerTable, h.FillSeconds, 100*s.Ratios["history_vs_project"], s.Ratios["history_p99_vs_project"])
			for _, sw := range h.Sweeps {
				fmt.Printf("  sweep %s %-15s %9d rows in %6.1fs (%8.0f rows/s), %7.0f MB before, %d dead tuples after\n",
					sw.Service, sw.Table, sw.Deleted, sw.Seconds, sw.RowsPerS, sw.MBBefore, sw.DeadAfter)
			}
		}
		for _, g := range sortedGoals(s.Goals) {
			mark := "met"
			if !s.Goals[g] {
				mark = "NOT met"
			}
			fmt.Printf("  goal %-32s %s\n", g, mark)
		}
		for _, g := range s.unjudged {
			fmt.Printf("  goal %-32s not measured in this run\n", g)
		}
	}
	if len(r.RealVsFake) > 0 {
		fmt.Printf("\nreal Kafka / kfake:")
		for _, k := range slices.Sorted(maps.Keys(r.RealVsFake)) {
			fmt.Printf(" %s %.2f×", k, r.RealVsFake[k])
		}
		fmt.Println()
	}
	if r.RealKafkaSkip != "" {
		fmt.Printf("\nreal Kafka: not run (%s)\n", r.RealKafkaSkip)
	}
}

// medianResult is a build's figures over its rounds: each field's median.
func medianResult(rs []Result) Result {
	out := rs[0]
	field := func(get func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		return median(v)
	}
	out.RoundTripsPerS = field(func(r Result) float64 { return r.RoundTripsPerS })
	out.HopLatencyMS = Percentiles{
		P50: field(func(r Result) float64 { return r.HopLatencyMS.P50 }),
		P95: field(func(r Result) float64 { return r.HopLatencyMS.P95 }),
		P99: field(func(r Result) float64 { return r.HopLatencyMS.P99 }),
	}
	out.LatencyCoresBusy = field(func(r Result) float64 { return r.LatencyCoresBusy })
	out.LatencyCores = cpuUse{
		Postgres: field(func(r Result) float64 { return r.LatencyCores.Postgres }),
		Services: field(func(r Result) float64 { return r.LatencyCores.Services }),
		Bench:    field(func(r Result) float64 { return r.LatencyCores.Bench }),
		Broker:   field(func(r Result) float64 { return r.LatencyCores.Broker }),
	}
	out.DBTxPerMessage = field(func(r Result) float64 { return r.DBTxPerMessage })
	out.CPU = cpuUse{
		Postgres: field(func(r Result) float64 { return r.CPU.Postgres }),
		Services: field(func(r Result) float64 { return r.CPU.Services }),
		Bench:    field(func(r Result) float64 { return r.CPU.Bench }),
		Broker:   field(func(r Result) float64 { return r.CPU.Broker }),
	}
	out.CPUSPer1000 = field(func(r Result) float64 { return r.CPUSPer1000 })
	out.SaturationS = field(func(r Result) float64 { return r.SaturationS })
	out.LatencySamples, out.LatencyMissing = 0, 0
	out.PerRound = nil
	out.History = rs[len(rs)-1].History
	for _, r := range rs {
		out.LatencySamples += r.LatencySamples
		out.LatencyMissing += r.LatencyMissing
		out.PerRound = append(out.PerRound, r.RoundTripsPerS)
	}
	return out
}

// median of v (the mean of the middle two for an even count); v is sorted
// in place.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

func machine() map[string]string {
	host, _ := os.Hostname()
	return map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version(), "host": host}
}

// writeReport writes v as indented JSON to the path in the environment
// variable env, else to def, and says so.
func writeReport(v any, env, def string, say func(string, ...any)) error {
	path := cmp.Or(os.Getenv(env), def)
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	say("wrote %s", path)
	return nil
}
