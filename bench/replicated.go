package main

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/progress"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// The replicated benchmark (-replicated): the project build's order round
// trips on one Postgres node beside the same on three nodes under Patroni
// (chaos/stack/patroni.go), replicating asynchronously, synchronously
// (synchronous_mode_strict), and asynchronously with DATABASE_STANDBYS=1
// (pkg/standby: nothing leaves a transaction before a standby holds it).
// What replication, and safety on it, cost a whole system; the
// database-level price of one commit is chaos/stack's BenchmarkStandbyPrice.

// replicatedBuilds, in the order each round runs them.
var replicatedBuilds = []struct {
	name, cluster string   // cluster: "" (one node), "async" or "sync"
	env           []string // the services' extra environment
}{
	{name: "one_node"},
	{name: "async", cluster: "async"},
	{name: "sync", cluster: "sync"},
	{name: "async_standbys", cluster: "async", env: []string{"DATABASE_STANDBYS=1"}},
}

// ReplicatedReport is bench-replicated-report.json.
type ReplicatedReport struct {
	When    string            `json:"when"`
	Machine map[string]string `json:"machine"`
	Params  params            `json:"params"`
	Kafka   string            `json:"kafka"`
	// Builds holds each build's medians over rounds, by name.
	Builds map[string]Result `json:"builds"`
	// Ratios divide each replicated build by one_node, as medians of each
	// round's ratio: round trips/s ("<build>_vs_one_node"), hop p99
	// ("<build>_p99_vs_one_node") and CPU seconds per 1,000 round trips
	// ("<build>_cpu_vs_one_node", every process of the machine's: the
	// replicas' too).
	Ratios        map[string]float64   `json:"ratios"`
	RatiosByRound []map[string]float64 `json:"ratios_by_round"`
	Notes         string               `json:"notes"`
}

// runReplicatedBench runs every replicated build once per round,
// alternating, on kfake (the broker is the same for all, and the fake adds
// the least noise of its own). The two clusters run from the start to the
// end, their databases fresh per build.
func runReplicatedBench(ctx context.Context, p params, smoke bool, say func(string, ...any)) error {
	if !smoke {
		p.LatencyFor = 20 // below saturation, p99 wants samples: 2,000 at 100/s
	}
	one, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer one.Stop() //nolint:errcheck
	clusters := map[string]database{"": one}
	for _, mode := range []string{"async", "sync"} {
		say("starting three Postgres nodes under Patroni, replicating %s", mode)
		c, err := stack.StartPatroni(ctx, stack.PatroniOptions{Synchronous: mode == "sync", Log: say})
		if err != nil {
			return fmt.Errorf("the %s cluster: %w", mode, err)
		}
		defer c.Close()
		if err := c.WaitStreaming(ctx); err != nil {
			return fmt.Errorf("the %s cluster: %w", mode, err)
		}
		clusters[mode] = c
	}

	rep := ReplicatedReport{When: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Params: p,
		Kafka: stack.ImplKfake, Builds: map[string]Result{}, Ratios: map[string]float64{}}
	byBuild := map[string][]Result{}
	steps, step, began := len(replicatedBuilds)*p.Rounds, 0, time.Now()
	for round := 1; round <= p.Rounds; round++ {
		for _, rb := range replicatedBuilds { // alternating: the machine's noise hits each alike
			say("== [step %d of %d%s] %s, round %d/%d %v", step+1, steps, progress.Left(step, steps, time.Since(began)), rb.name, round, p.Rounds, rb.env)
			step++
			b := build{name: rb.name, env: rb.env, kafka: stack.ImplKfake}
			res, err := runServices(ctx, clusters[rb.cluster], p, round, b, rb.env, true, say)
			if err != nil {
				return fmt.Errorf("%s: %w", rb.name, err)
			}
			say("%s: %.0f round trips/s, hop p50/p95/p99 %.1f/%.1f/%.1f ms at %.0f/s, %.2f CPU s/1000 (postgres %.2f, services %.2f)",
				rb.name, res.RoundTripsPerS, res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, p.LatencyRate,
				res.CPUSPer1000, res.CPU.Postgres, res.CPU.Services)
			byBuild[rb.name] = append(byBuild[rb.name], res)
		}
	}
	for _, rb := range replicatedBuilds {
		rep.Builds[rb.name] = medianResult(byBuild[rb.name])
	}
	// Each ratio per round (the builds of a round ran minutes apart), then
	// the median over rounds.
	for round := range p.Rounds {
		one := byBuild["one_node"][round]
		m := map[string]float64{}
		for _, rb := range replicatedBuilds[1:] {
			res := byBuild[rb.name][round]
			m[rb.name+"_vs_one_node"] = ratio(res.RoundTripsPerS, one.RoundTripsPerS)
			m[rb.name+"_p99_vs_one_node"] = ratio(res.HopLatencyMS.P99, one.HopLatencyMS.P99)
			m[rb.name+"_cpu_vs_one_node"] = ratio(res.CPUSPer1000, one.CPUSPer1000)
		}
		rep.RatiosByRound = append(rep.RatiosByRound, m)
	}
	for k := range rep.RatiosByRound[0] {
		var v []float64
		for _, m := range rep.RatiosByRound {
			v = append(v, m[k])
		}
		rep.Ratios[k] = median(v)
	}
	rep.Notes = "One machine, 2 cores: the three nodes of a cluster share the CPU with the services, the broker and each other, so a replica costs CPU here that it would not on a machine of its own, and the network between nodes is loopback (no round-trip time): the ratios are a floor on what replication costs, not a forecast. A hop runs from the payment's answer to the reservation's commit in inventory, so it holds the relay's wait for a standby, not the consumer's (which comes after its commit, before its ack)."
	printReplicated(rep, say)
	return writeReport(rep, "BENCH_REPLICATED_REPORT", "bench-replicated-report.json", say)
}

// printReplicated prints the builds side by side.
func printReplicated(r ReplicatedReport, say func(string, ...any)) {
	say("replicated Postgres, %d rounds, medians (kfake; hop latency at %.0f orders/s):", r.Params.Rounds, r.Params.LatencyRate)
	say("  %-16s %14s %9s %9s %9s %10s %12s %12s %12s", "build", "round trips/s", "p50 ms", "p95 ms", "p99 ms", "CPU s/1000", "vs one node", "p99 vs one", "CPU vs one")
	for _, rb := range replicatedBuilds {
		res := r.Builds[rb.name]
		vs, p99, cpu := "1", "1", "1"
		if rb.cluster != "" {
			vs = fmt.Sprintf("%.2f", r.Ratios[rb.name+"_vs_one_node"])
			p99 = fmt.Sprintf("%.2f", r.Ratios[rb.name+"_p99_vs_one_node"])
			cpu = fmt.Sprintf("%.2f", r.Ratios[rb.name+"_cpu_vs_one_node"])
		}
		say("  %-16s %14.0f %9.1f %9.1f %9.1f %10.2f %12s %12s %12s", rb.name, res.RoundTripsPerS,
			res.HopLatencyMS.P50, res.HopLatencyMS.P95, res.HopLatencyMS.P99, res.CPUSPer1000, vs, p99, cpu)
	}
}
