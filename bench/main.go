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
// Speed claims are the ratios between these, measured in the same run.
// It writes bench-report.json (BENCH_REPORT overrides the path) and an SVG
// chart next to it.
//
//	go run ./bench            # make bench
//	go run ./bench -smoke     # seconds; what CI runs
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/outboxref/outbox-inbox/internal/stack"
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
	LimitBatch  int     `json:"limit_batch"`  // orders per transaction in the limit build
	Rounds      int     `json:"rounds"`       // each build runs this often, alternating; figures are medians
	Seed        uint64  `json:"seed"`
}

// Result is one build's figures.
type Result struct {
	Build          string      `json:"build"`
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
	LatencyCoresBusy float64  `json:"latency_phase_cores_busy"`
	Env              []string `json:"env,omitempty"`
	Notes            string   `json:"notes,omitempty"`
	// PerRound is each round's round trips/s, in order; the figures above
	// are the medians over rounds, field by field.
	PerRound []float64 `json:"round_trips_per_s_by_round,omitempty"`
}

// Percentiles of one-hop latency, producer commit → consumer commit.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Report is bench-report.json.
type Report struct {
	When          string               `json:"when"`
	Machine       map[string]string    `json:"machine"`
	Params        params               `json:"params"`
	Textbook      Result               `json:"textbook"`
	Project       Result               `json:"project"`
	ProjectNoDup  Result               `json:"project_dedupe_off"`
	Limit         Result               `json:"limit"`
	Ratios        map[string]float64   `json:"ratios"` // medians of each round's ratios
	RatiosByRound []map[string]float64 `json:"ratios_by_round"`
	Goals         map[string]bool      `json:"goals"`
	Chart         string               `json:"chart"`
}

func run(ctx context.Context) error {
	smoke := flag.Bool("smoke", false, "a few seconds per build: checks the benchmark works, measures nothing")
	only := flag.String("only", "", "run only these builds (comma-separated), for working on one; the report is then partial")
	orders := flag.Int("orders", 0, "override the number of round trips in the saturation phase")
	partitions := flag.Int("partitions", 0, "override the number of partitions per topic")
	rounds := flag.Int("rounds", 3, "run every build this many times, alternating, and report medians: the machine's noise hits each build alike")
	limitBatch := flag.Int("limit-batch", 0, "override the orders per transaction of the limit build (100), to see what batch size alone is worth")
	rate := flag.Float64("rate", 0, "override the offered load of the latency phase (orders/s; the goal is stated at 500)")
	extraEnv := flag.String("env", "", "extra environment for the services of every build, comma-separated KEY=VALUE (for trying a setting; the report records it)")
	flag.Parse()
	p := params{Orders: 20_000, Payers: 32, SKUs: 500, Partitions: 32, LatencyRate: 500, LatencyFor: 8, LimitBatch: 100, Seed: 1}
	p.Rounds = max(1, *rounds)
	if *smoke {
		p.Orders, p.LatencyFor, p.Rounds = 500, 1, 1
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
	want := func(build string) bool { return *only == "" || strings.Contains(","+*only+",", ","+build+",") }
	path := os.Getenv("BENCH_REPORT")
	if path == "" {
		path = "bench-report.json"
	}

	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	pg, err := stack.StartPostgres(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck

	r := Report{When: time.Now().UTC().Format(time.RFC3339), Params: p, Machine: machine()}
	say("params: %+v", p)
	builds := []struct {
		name string
		env  []string
		dst  *Result
	}{
		{"textbook", []string{"RELAY_DRIVER=textbook", "INBOX_BATCH_SIZE=1", "API_BATCH_SIZE=1"}, &r.Textbook},
		{"project", nil, &r.Project},
		{"project_dedupe_off", []string{"INBOX_DISABLED=true"}, &r.ProjectNoDup},
		{"limit", nil, &r.Limit},
	}
	// Every build runs once per round, so a noisy spell of the shared
	// machine lands on all of them alike; each round's ratios compare builds
	// measured minutes apart.
	byBuild := map[string][]Result{}
	for round := 1; round <= p.Rounds; round++ {
		for _, b := range builds {
			if !want(b.name) {
				continue
			}
			var res Result
			var err error
			if b.name == "limit" {
				say("== limit, round %d/%d (batched SQL, no Kafka, no services)", round, p.Rounds)
				res, err = runLimit(ctx, pg, p, round, say)
			} else {
				env := b.env
				if *extraEnv != "" {
					env = append(env, strings.Split(*extraEnv, ",")...)
				}
				say("== %s, round %d/%d %v", b.name, round, p.Rounds, env)
				res, err = runServices(ctx, pg, p, round, b.name, env, b.name != "project_dedupe_off", say)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", b.name, err)
			}
			say("%s: %.0f round trips/s, hop p50/p95/p99 %.1f/%.1f/%.1f ms (%.2f cores busy at %.0f/s), %.2f db tx/message, %.2f CPU s/1000 (postgres %.2f, services %.2f, bench+broker %.2f)",
				b.name, res.RoundTripsPerS, res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, res.LatencyCoresBusy, p.LatencyRate,
				res.DBTxPerMessage, res.CPUSPer1000, res.CPU.Postgres, res.CPU.Services, res.CPU.Bench)
			byBuild[b.name] = append(byBuild[b.name], res)
		}
	}
	for _, b := range builds {
		if rs := byBuild[b.name]; len(rs) > 0 {
			*b.dst = medianResult(rs)
		}
	}

	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0 // a build left out with -only
		}
		return a / b
	}
	overhead := func(with, without float64) float64 {
		if with == 0 || without == 0 {
			return 0 // a build left out with -only
		}
		return 1 - with/without
	}
	at := func(build string, round int) float64 {
		if rs := byBuild[build]; round < len(rs) {
			return rs[round].RoundTripsPerS
		}
		return 0
	}
	for round := range p.Rounds {
		r.RatiosByRound = append(r.RatiosByRound, map[string]float64{
			"project_vs_textbook": ratio(at("project", round), at("textbook", round)),
			"project_vs_limit":    ratio(at("project", round), at("limit", round)),
			"inbox_overhead":      overhead(at("project", round), at("project_dedupe_off", round)),
		})
	}
	r.Ratios = map[string]float64{}
	for _, k := range []string{"project_vs_textbook", "project_vs_limit", "inbox_overhead"} {
		var v []float64
		for _, m := range r.RatiosByRound {
			v = append(v, m[k])
		}
		r.Ratios[k] = median(v)
	}
	// A goal is judged only when this run measured what it needs: a build
	// left out with -only, or a latency phase at another rate, leaves it
	// unjudged instead of passing it on a zero.
	r.Goals = map[string]bool{}
	var unjudged []string
	judge := func(goal string, measured, met bool) {
		if measured {
			r.Goals[goal] = met
		} else {
			unjudged = append(unjudged, goal)
		}
	}
	has := func(build string) bool { return len(byBuild[build]) > 0 }
	judge("project >= 3x textbook", has("project") && has("textbook"), r.Ratios["project_vs_textbook"] >= 3)
	judge("project >= 40% of limit", has("project") && has("limit"), r.Ratios["project_vs_limit"] >= 0.4)
	judge("p99 hop <= 25ms at 500/s", has("project") && p.LatencyRate == 500, r.Project.HopLatencyMS.P99 <= 25)
	judge("inbox overhead <= 15%", has("project") && has("project_dedupe_off"), r.Ratios["inbox_overhead"] <= 0.15)
	judge("project >= 5000 round trips/s", has("project"), r.Project.RoundTripsPerS >= 5000)
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
	fmt.Println()
	fmt.Printf("%-20s %12s %9s %9s %9s %7s %10s %10s\n", "build", "round trip/s", "p50 ms", "p95 ms", "p99 ms", "cores", "tx/msg", "CPU s/1k")
	for _, res := range []Result{r.Textbook, r.Project, r.ProjectNoDup, r.Limit} {
		if res.Build == "" {
			continue // left out with -only
		}
		fmt.Printf("%-20s %12.0f %9.1f %9.1f %9.1f %7.2f %10.2f %10.2f\n", res.Build, res.RoundTripsPerS,
			res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, res.LatencyCoresBusy, res.DBTxPerMessage, res.CPUSPer1000)
	}
	if p.Rounds > 1 {
		fmt.Printf("(medians of %d rounds; round trips/s by round:", p.Rounds)
		for _, res := range []Result{r.Textbook, r.Project, r.ProjectNoDup, r.Limit} {
			if len(res.PerRound) > 0 {
				fmt.Printf(" %s %.0f", res.Build, res.PerRound)
			}
		}
		fmt.Println(")")
	}
	fmt.Printf("\nproject/textbook %.2f×, project/limit %.0f%%, inbox overhead %.1f%%\n",
		r.Ratios["project_vs_textbook"], 100*r.Ratios["project_vs_limit"], 100*r.Ratios["inbox_overhead"])
	for _, g := range sortedGoals(r.Goals) {
		mark := "met"
		if !r.Goals[g] {
			mark = "NOT met"
		}
		fmt.Printf("  goal %-32s %s\n", g, mark)
	}
	for _, g := range unjudged {
		fmt.Printf("  goal %-32s not measured in this run\n", g)
	}
	fmt.Printf("\nwrote %s and %s\n", path, r.Chart)
	if *smoke {
		fmt.Println("(smoke run: the figures above measure nothing)")
	}
	return nil
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
	out.DBTxPerMessage = field(func(r Result) float64 { return r.DBTxPerMessage })
	out.CPU = cpuUse{
		Postgres: field(func(r Result) float64 { return r.CPU.Postgres }),
		Services: field(func(r Result) float64 { return r.CPU.Services }),
		Bench:    field(func(r Result) float64 { return r.CPU.Bench }),
	}
	out.CPUSPer1000 = field(func(r Result) float64 { return r.CPUSPer1000 })
	out.SaturationS = field(func(r Result) float64 { return r.SaturationS })
	out.LatencySamples, out.LatencyMissing = 0, 0
	out.PerRound = nil
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
