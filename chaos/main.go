// Command chaos is the project's proof: it runs orders ×2 and inventory ×3 as
// real processes, kills them with SIGKILL at every named crash window and at
// random moments, restarts Postgres, injects broker faults and hostile
// messages, and then proves with SQL that nothing was applied twice and
// nothing was lost, and from what Kafka holds that each key's messages
// arrived in commit order (probe streams the harness writes itself).
//
//	go run ./chaos -profile ci -seed 7 -report chaos-report.json
//	go run ./chaos -profile ci -seed 7 -inbox=off   # control: the domain guard alone must hold
//	go run ./chaos -profile ci -seed 7 -inbox=off -guard=off   # control: must FAIL
//	go run ./chaos -profile smoke -seed 7 -effect-keys=off     # control: must FAIL with double captures
//	go run ./chaos -profile apache -seed 7          # real Apache Kafka: 3 brokers, broker and network faults
//	go run ./chaos -profile smoke -orders 2000 -seed 7 -relay=parallel   # control: ordered-per-key must FAIL
//	go run ./chaos -scenario after-commit-before-ack # one kill, narrated
//
// It exits non-zero when any invariant fails.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: FAIL:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	var (
		profileName = flag.String("profile", "ci", "ci, apache (real Kafka), failover (real Kafka on a replicated Postgres), long or smoke")
		seed        = flag.Uint64("seed", uint64(time.Now().UnixNano()%1_000_000), "seeds every random choice; printed, reusable")
		reportPath  = flag.String("report", "", "write the JSON report here")
		inboxFlag   = flag.String("inbox", "on", "on, or off for the control runs: the guard must then catch every redelivery")
		guardFlag   = flag.String("guard", "on", "the services' domain guard: on, or off (with -inbox=off) for the second control run, which must fail")
		keysFlag    = flag.String("effect-keys", "on", "idempotency keys on payment captures: on, or off for the effect control run, which must fail with double captures")
		scenario    = flag.String("scenario", "", "learning mode: one order, one kill at this window, narrated")
		orders      = flag.Int("orders", 0, "override the profile's order count")
		standbys    = flag.Int("standbys", 0, "with a replicated Postgres (failover profiles): how many standbys must hold a transaction before anything that rests on it leaves a service (DATABASE_STANDBYS); failover-async passes with 1")
		relay       = flag.String("relay", "", "the services' relays: leader (one leads each outbox), sharded (RELAY_SHARDS), or parallel for the ordering control run, which must fail ordered-per-key; default: the profile's")
	)
	flag.Parse()

	if *scenario != "" {
		return runScenario(ctx, failpoint.Name(*scenario))
	}
	p, ok := profiles[*profileName]
	if !ok {
		return fmt.Errorf("unknown profile %q", *profileName)
	}
	if *orders > 0 {
		p.Orders = *orders
	}
	if err := p.setRelay(*relay); err != nil {
		return err
	}
	if *standbys < 0 || *standbys > 0 && p.Failover == "" {
		return fmt.Errorf("-standbys needs a failover profile and a count of at least 0, not %d on %s", *standbys, p.Name)
	}
	p.Standbys = *standbys
	if *inboxFlag != "on" && *inboxFlag != "off" {
		return fmt.Errorf("-inbox must be on or off, not %q", *inboxFlag)
	}
	if *guardFlag != "on" && *guardFlag != "off" {
		return fmt.Errorf("-guard must be on or off, not %q", *guardFlag)
	}
	if *keysFlag != "on" && *keysFlag != "off" {
		return fmt.Errorf("-effect-keys must be on or off, not %q", *keysFlag)
	}
	h := newHarness(p, *seed, *inboxFlag == "on", *guardFlag == "on", *keysFlag == "on")
	report, err := h.run(ctx)
	// A failure's last line names its schedule, so a CI log's tail is
	// enough to replay it.
	replay := fmt.Sprintf("seed %d; replay: go run ./chaos -profile %s -seed %d%s", *seed, p.Name, *seed, replayFlags())
	writeFinalStatus(report) // status.go: the dashboard shows the verdict
	if report != nil {
		report.print()
		if *reportPath != "" {
			data, jerr := json.MarshalIndent(report, "", "  ")
			if jerr != nil {
				return jerr
			}
			if werr := os.WriteFile(*reportPath, append(data, '\n'), 0o644); werr != nil {
				return werr
			}
			fmt.Printf("report written to %s\n", *reportPath)
		}
	}
	if err != nil {
		return fmt.Errorf("%w (%s)", err, replay)
	}
	if !report.Passed {
		return fmt.Errorf("invariants violated: %s (the table above has each one's detail; %s)", failedBrief(report), replay)
	}
	fmt.Println("PASS")
	return nil
}

// replayFlags are the flags given other than -profile, -seed, -report and
// -status, as a command line would repeat them.
func replayFlags() string {
	var out string
	flag.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "profile", "seed", "report", "status":
			return
		}
		out += fmt.Sprintf(" -%s=%s", f.Name, f.Value)
	})
	return out
}

// profile sizes a run.
type profile struct {
	Name         string
	Orders       int           // orders created and paid
	Rate         float64       // orders per second offered
	MinPerWindow int           // kills each crash window must reach
	MinKills     int           // kills in all (crash windows + random)
	PGRestarts   int           // Postgres restarts during the load
	GraceMin     time.Duration // an armed incarnation lives at least this long
	GraceMax     time.Duration // and at most about this long before its window may fire
	RandomKill   time.Duration // mean time between random SIGKILLs
	BrokerFault  time.Duration // mean time between broker faults
	Drain        time.Duration // how long settling may go without progress after the load (at most three times it in all)

	// The real-Kafka profile's broker and its faults.
	Broker          string        // stack.ImplApache; "" is STACK_KAFKA's choice (kfake by default)
	Nodes           int           // Apache Kafka nodes
	NetFault        time.Duration // mean time between network faults (0: no proxies)
	MinBrokerKills  int           // broker SIGKILLs the run must reach
	MinPauses       int           // zombie pauses the run must reach
	ClusterRestarts int           // full-cluster restarts during the load
	MinNetKinds     int           // network fault kinds the run must apply
	// RelayShards, when over 1, has the replicas' relays share each
	// outbox in that many shards (RELAY_SHARDS): orders' two and
	// inventory's three relays all publish, and move shards as they are
	// killed and restarted.
	RelayShards int
	// RelayParallel, the ordering control run (-relay=parallel), has every
	// replica's relay publish at once (RELAY_PARALLEL) in small batches,
	// so that they claim interleaved runs of the outbox and a key's
	// messages overtake each other: ordered-per-key must fail.
	RelayParallel bool
	// Failover, when set, runs the system on a replicated Postgres (three
	// nodes under Patroni, stack.StartPatroni) replicating "sync"
	// (synchronous_mode_strict) or "async", and fails its primary over
	// Failovers times each way (failover.go) during the load.
	Failover  string
	Failovers int
	// Standbys (-standbys), with Failover, is DATABASE_STANDBYS for the
	// services and the provider: what leaves a transaction waits until
	// that many standbys hold it (pkg/standby). 0: nothing waits.
	Standbys int
}

// setRelay applies -relay: "" keeps the profile's relays.
func (p *profile) setRelay(mode string) error {
	switch mode {
	case "":
	case "leader":
		p.RelayShards = 0
	case "sharded":
		p.RelayShards = max(p.RelayShards, 8)
	case "parallel":
		p.RelayShards, p.RelayParallel = 0, true
	default:
		return fmt.Errorf("-relay must be leader, sharded or parallel, not %q", mode)
	}
	return nil
}

// relay names the profile's relays for the log and the report.
func (p profile) relay() string {
	switch {
	case p.RelayParallel:
		return "parallel (control run: each key's order given up)"
	case p.RelayShards > 1:
		return fmt.Sprintf("sharded (%d shards)", p.RelayShards)
	}
	return "one leader per outbox"
}

// relayEnv is the services' relay configuration.
func (p profile) relayEnv() []string {
	env := []string{fmt.Sprintf("RELAY_SHARDS=%d", p.RelayShards)}
	if p.RelayParallel {
		env = append(env, "RELAY_PARALLEL=true", "RELAY_BATCH_SIZE=4")
	}
	return env
}

var profiles = map[string]profile{
	"smoke": {Name: "smoke", Orders: 800, Rate: 80, MinPerWindow: 1, MinKills: 10, PGRestarts: 1,
		GraceMin: 1 * time.Second, GraceMax: 3 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 2 * time.Second, Drain: 2 * time.Minute},
	"ci": {Name: "ci", Orders: 10_000, Rate: 60, MinPerWindow: 10, MinKills: 150, PGRestarts: 1,
		GraceMin: 1500 * time.Millisecond, GraceMax: 4 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 2 * time.Second, Drain: 3 * time.Minute},
	// The proof on real Apache Kafka: three JVM brokers (replication 3,
	// min.insync.replicas 2, acks=all), leaders and coordinators SIGKILLed,
	// a zombie pause, a full-cluster restart, and network faults between
	// the services and Kafka and Postgres, on top of everything ci does.
	"apache": {Name: "apache", Orders: 8_500, Rate: 60, MinPerWindow: 10, MinKills: 100, PGRestarts: 1,
		GraceMin: 1500 * time.Millisecond, GraceMax: 4 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 6 * time.Second, Drain: 4 * time.Minute,
		Broker: stack.ImplApache, Nodes: 3, NetFault: 4 * time.Second, MinBrokerKills: 5, MinPauses: 1, ClusterRestarts: 1, MinNetKinds: 3,
		RelayShards: 8},
	"failover": {Name: "failover", Orders: 4_000, Rate: 25, MinPerWindow: 5, MinKills: 50,
		GraceMin: 1500 * time.Millisecond, GraceMax: 4 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 8 * time.Second, Drain: 4 * time.Minute,
		Broker: stack.ImplApache, Nodes: 3, MinBrokerKills: 2, RelayShards: 8, Failover: "sync", Failovers: 2},
	// failover's control: the same on asynchronous replication with the
	// replicas behind at each failure must fail, with ghosts and lost
	// messages named (make failover).
	// Once each way is enough to fail, and what it lost never settles: its
	// drain gives up after a minute without progress.
	"failover-async": {Name: "failover-async", Orders: 3_000, Rate: 25, MinPerWindow: 5, MinKills: 50,
		GraceMin: 1500 * time.Millisecond, GraceMax: 4 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 8 * time.Second, Drain: time.Minute,
		Broker: stack.ImplApache, Nodes: 3, MinBrokerKills: 2, RelayShards: 8, Failover: "async", Failovers: 1},
	"long": {Name: "long", Orders: 50_000, Rate: 70, MinPerWindow: 50, MinKills: 700, PGRestarts: 4,
		GraceMin: 1500 * time.Millisecond, GraceMax: 5 * time.Second, RandomKill: 3 * time.Second, BrokerFault: 2 * time.Second, Drain: 5 * time.Minute},
}

// failedBrief names each failed invariant with the start of its detail, on
// one line, so the last line of a failed run says what failed even where only the tail
// of its output is kept (a CI log).
func failedBrief(r *Report) string {
	var parts []string
	for _, name := range strings.Split(r.Failed, ",") {
		detail := []rune(strings.ReplaceAll(r.Details[name], "\n", " "))
		if len(detail) > 300 {
			detail = append(detail[:300], '…')
		}
		parts = append(parts, name+" ("+string(detail)+")")
	}
	return strings.Join(parts, "; ")
}
