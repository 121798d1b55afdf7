package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/progress"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// windowsFor lists the crash windows a service's code reaches.
func windowsFor(service string, inbox bool) []failpoint.Name {
	var w []failpoint.Name
	for _, n := range failpoint.All {
		switch {
		case n == failpoint.AfterCommitBeforeResponse && service != "orders": // inventory serves no payments
		case judge.EffectWindow(n) && service != "orders": // only orders performs effects (its captures)
		case n == failpoint.AfterInboxInsert && !inbox: // no inbox row, no window
		default:
			w = append(w, n)
		}
	}
	return w
}

// reached reports whether some service's code reaches window w.
func reached(w failpoint.Name, inbox bool) bool { return reachers(w, inbox) > 0 }

// reachers counts the services whose code reaches window w.
func reachers(w failpoint.Name, inbox bool) int {
	n := 0
	for _, svc := range system.Services {
		if slices.Contains(windowsFor(svc, inbox), w) {
			n++
		}
	}
	return n
}

// svcWindow is a crash window in one service.
type svcWindow struct {
	service string
	window  failpoint.Name
}

// harness runs one chaos run.
type harness struct {
	p     profile
	seed  uint64
	inbox bool
	guard bool // the services' domain guard (DOMAIN_GUARD_DISABLED when off)
	keys  bool // effects carry their idempotency key (EFFECT_KEYS_DISABLED when off)

	mu       sync.Mutex
	rng      *rand.Rand
	draining bool
	pending  map[svcWindow]int // armed incarnations that have not died yet
	armedAs  map[string]failpoint.Name
	fired    map[svcWindow]int    // kills of the system's own messages, from the failpoint log, refreshed as it grows
	hostile  map[string]bool      // the hostile messages' subjects: a kill on one meets no window for arming
	pids     map[int]string       // pid → service, of every incarnation started
	born     map[string]time.Time // process name → when its incarnation started

	randomKills atomic.Int64
	restarts    atomic.Int64
	pgRestarts  atomic.Int64
	faults      faultInjector
	apache      *apacheFaults        // the real-Kafka profile's broker faults, or nil
	net         *netFaults           // its network faults, or nil
	failovers   *dbFailovers         // the replicated Postgres's failovers (profile.Failover), or nil
	lags        []judge.PartitionLag // the groups' offsets when a drain missed its deadline (diagnoseStall)
	probes      []*probeWriter       // each service's probe stream (probe.go)
	fpLog       string
	sys         *system.System
	payments    judge.PaymentReport
	audit       AuditRow // what the auditor beside the run found
	start       time.Time
}

func newHarness(p profile, seed uint64, inbox, guard, keys bool) *harness {
	return &harness{
		p: p, seed: seed, inbox: inbox, guard: guard, keys: keys,
		rng:     rand.New(rand.NewPCG(seed, 0xc4a05)),
		pending: map[svcWindow]int{},
		armedAs: map[string]failpoint.Name{},
		fired:   map[svcWindow]int{},
		pids:    map[int]string{},
		born:    map[string]time.Time{},
	}
}

func (h *harness) say(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

// randDuration returns a duration in [lo, hi), from the seeded generator.
func (h *harness) randDuration(lo, hi time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return lo + time.Duration(h.rng.Int64N(int64(hi-lo)+1))
}

// arm chooses the crash window of a process incarnation that is about to
// start: a window its service has not met yet, else the window that has
// fired least so far for the services that can meet it, fired on its
// first hit after a random grace period. Some incarnations are left unarmed
// and are only ever killed at random.
func (h *harness) arm(p *procs.Proc) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.armedAs, p.Name)
	if h.draining || h.rng.Float64() < 0.15 {
		return nil
	}
	windows := windowsFor(p.Service, h.inbox)
	best := windows[h.rng.IntN(len(windows))]
	// First a window this service has not met yet, then the window least
	// met by all: every window reaches the profile's minimum, and each
	// service's consumer meets every consumer window.
	mine := func(w failpoint.Name) int { k := svcWindow{p.Service, w}; return h.fired[k] + h.pending[k] }
	all := func(w failpoint.Name) int {
		n := 0
		for _, m := range []map[svcWindow]int{h.fired, h.pending} {
			for k, v := range m {
				if k.window == w {
					n += v
				}
			}
		}
		return n
	}
	less := func(a, b failpoint.Name) bool {
		if (mine(a) == 0) != (mine(b) == 0) {
			return mine(a) == 0
		}
		// Of the windows this service has not met, after-commit-before-ack
		// first: attribution requires it of every consumer, and by the
		// count of all it would come last, behind the other service's
		// consumer, which meets it more; a short run (smoke) could end
		// before orders' consumer met it.
		ack := failpoint.AfterCommitBeforeAck
		if mine(a) == 0 && (a == ack) != (b == ack) {
			return a == ack
		}
		// Then the least met, each window's count weighed by the services
		// that can meet it: a window only orders reaches (its payment
		// answers and captures) has only orders' incarnations to meet it,
		// while inventory's, meeting nothing else, keep the shared windows
		// going. Unweighed, orders spent its kills on shared windows as
		// soon as they fell behind, and in a slow run (real Kafka, a
		// loaded machine) its own windows ended below the minimum
		// (7, 7, 8 of 10) with every shared one above it.
		return all(a)*reachers(a, h.inbox) < all(b)*reachers(b, h.inbox)
	}
	for _, w := range windows {
		if less(w, best) {
			best = w
		}
	}
	h.pending[svcWindow{p.Service, best}]++
	h.armedAs[p.Name] = best
	grace := h.p.GraceMin + time.Duration(h.rng.Int64N(int64(h.p.GraceMax-h.p.GraceMin)+1))
	return []string{
		fmt.Sprintf("FAILPOINTS=%s=every:1", best),
		"FAILPOINT_GRACE=" + grace.String(),
		fmt.Sprintf("FAILPOINT_SEED=%d", h.seed),
	}
}

// exited settles the arming of an incarnation that died.
func (h *harness) exited(p *procs.Proc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w, ok := h.armedAs[p.Name]; ok {
		h.pending[svcWindow{p.Service, w}]--
		delete(h.armedAs, p.Name)
	}
}

func (h *harness) run(ctx context.Context) (*Report, error) {
	h.start = time.Now()
	work, err := os.MkdirTemp("", "chaos-")
	if err != nil {
		return nil, err
	}
	h.fpLog = filepath.Join(work, "failpoints.log")
	h.say("seed %d, profile %s (%d orders at %.0f/s), inbox %s, domain guard %s, relays %s", h.seed, h.p.Name, h.p.Orders, h.p.Rate, onOff(h.inbox), onOff(h.guard), h.p.relay())
	if h.p.Failover != "" {
		h.say("postgres: three nodes replicating %s; what leaves a transaction waits for %d standbys (DATABASE_STANDBYS)", h.p.Failover, h.p.Standbys)
	}
	h.say("logs in %s", work)

	kopts := stack.KafkaOptions{MinSessionTimeout: 500 * time.Millisecond, Impl: h.p.Broker, Nodes: h.p.Nodes, Topics: probeTopics()}
	kopts.Apache.Log = h.say
	var serviceDBURL func(string) string
	if h.p.NetFault > 0 {
		// Toxiproxy between the services and Postgres and every Kafka node;
		// the harness's own clients go around it.
		h.net = newNetFaults(h.seed, h.say)
		defer h.net.close()
		serviceDBURL = h.net.postgresURL
		kopts.Apache.AdvertiseClient = h.net.kafkaAddr
	}
	var pg system.Postgres
	if h.p.Failover != "" {
		c, err := stack.StartPatroni(ctx, stack.PatroniOptions{Synchronous: h.p.Failover == "sync", Log: h.say})
		if err != nil {
			return nil, fmt.Errorf("starting the replicated postgres: %w", err)
		}
		// Stopped with the run: system.Stop stops only a Postgres it
		// started, and Patroni dies with this process (its death signal),
		// but not the Postgres it started, nor its directory.
		defer c.Close()
		pg = c
		h.failovers = &dbFailovers{c: c, say: h.say}
	}
	sys, err := system.Start(ctx, system.Options{
		Postgres:     pg,
		ServiceDBURL: serviceDBURL,
		Work:         work,
		Replicas:     map[string]int{"orders": 2, "inventory": 3},
		Env: append(h.p.relayEnv(),
			"KAFKA_SESSION_TIMEOUT=1s",
			"KAFKA_REBALANCE_TIMEOUT=3s",
			"KAFKA_COMMIT_INTERVAL=200ms",
			// A partition held with records waiting and none delivered for
			// this long ends its process (inboxkafka.Watchdog); the
			// supervisor restarts it like any other.
			"KAFKA_STALL_TIMEOUT=20s",
			"RELAY_POLL_INTERVAL=100ms",
			"RELAY_LEASE_TTL=2s",
			// Every outbox row stays for the judge (the relay keeps them 15
			// days by default): an applied event whose row is gone is a
			// ghost (judge.NoGhosts), not one retention took.
			"INBOX_RETRY_BACKOFF=20ms",
			"INBOX_MAX_PAYLOAD_BYTES=65536",
			fmt.Sprintf("INBOX_DISABLED=%t", !h.inbox),
			fmt.Sprintf("DOMAIN_GUARD_DISABLED=%t", !h.guard),
			// Captures: a claimed capture whose runner died is called again
			// after the lease.
			"EFFECT_LEASE=3s",
			"EFFECT_MIN_BACKOFF=50ms",
			"EFFECT_MAX_BACKOFF=1s",
			fmt.Sprintf("EFFECT_KEYS_DISABLED=%t", !h.keys),
			// -standbys: what leaves a transaction waits for its
			// standbys (pkg/standby), the mode that makes asynchronous
			// replication safe.
			fmt.Sprintf("DATABASE_STANDBYS=%d", h.p.Standbys),
			"FAILPOINT_LOG="+h.fpLog,
			// Every window traced: the judge checks the trace against the model
			// and asks whether a killed subject was seen again.
			"FAILPOINT_TRACE="+joinNames(failpoint.All),
		),
		// The provider's own faults: 500s before anything is done, and
		// captures performed whose answer is lost (the provider's half of
		// after-effect-before-record), with latency.
		ProviderEnv: []string{
			"PROVIDER_FAIL_RATE=0.05",
			"PROVIDER_LOST_RESPONSE_RATE=0.05",
			"PROVIDER_LATENCY_MAX=20ms",
			// A key whose request died with the provider's database
			// connection (a Postgres restart) is taken over after this.
			"PROVIDER_KEY_LOCK_TIMEOUT=3s",
			fmt.Sprintf("PROVIDER_SEED=%d", h.seed),
			fmt.Sprintf("PROVIDER_DATABASE_STANDBYS=%d", h.p.Standbys),
		},
		Kafka:   kopts,
		EnvHook: h.arm,
		Log:     func(f string, a ...any) { h.say(f, a...) },
	})
	if err != nil {
		return nil, err
	}
	defer sys.Stop()
	h.sys = sys

	skus := loadgen.SKUs(20)
	stock := loadgen.StockFor(h.p.Orders, skus)
	if err := sys.Client.SeedStock(ctx, stock); err != nil {
		return nil, fmt.Errorf("seeding stock: %w", err)
	}

	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	superviseCtx, stopSupervising := context.WithCancel(ctx)
	defer stopSupervising()
	for _, p := range sys.All() {
		h.started(p)
	}
	h.supervise(superviseCtx)
	h.say("broker: %s", sys.Kafka.Describe())
	if c := sys.Kafka.Apache(); c != nil {
		h.apache = newApacheFaults(c, h.seed, h.say)
		h.faults = h.apache
	} else {
		h.faults = newBrokerFaults(sys.Kafka.Cluster(), h.seed)
	}
	var wg sync.WaitGroup
	// The probe streams (probe.go) run as long as the load, at a third of
	// its pace in messages per service.
	for _, svc := range system.Services {
		w := newProbeWriter(svc, h.seed)
		w.standbys = h.p.Standbys
		h.probes = append(h.probes, w)
		wg.Add(1)
		go func() { defer wg.Done(); w.run(chaosCtx, sys.DBURL[svc], h.p.Rate/3, h.say) }()
	}
	wg.Add(4)
	go func() { defer wg.Done(); h.killRandomly(chaosCtx) }()
	go func() { defer wg.Done(); h.faults.run(chaosCtx, h.p.BrokerFault) }()
	go func() { defer wg.Done(); h.progress(chaosCtx) }()
	go func() {
		defer wg.Done()
		if h.net != nil {
			h.net.run(chaosCtx, h.p.NetFault)
		}
	}()
	go h.writeStatus(ctx) // status.go: live status for cmd/dashboard (-status)

	var paid atomic.Int64
	hostile := newHostile(sys, h.seed, h.inbox)
	hostile.keys = h.keys
	pgAt := restartPoints(h.p.Orders, h.p.PGRestarts)
	clusterAt := restartPoints(h.p.Orders, h.p.ClusterRestarts)
	var failAt []int64
	if h.failovers != nil {
		failAt = restartPoints(h.p.Orders, len(failoverKinds)*h.p.Failovers)
	}
	for i := range clusterAt { // a third of the way between Postgres restarts, not on them
		clusterAt[i] += int64(h.p.Orders / (3 * (h.p.ClusterRestarts + 1)))
	}
	var hostileOnce sync.Once
	loadCtx, cancelLoad := context.WithTimeout(ctx, time.Duration(float64(h.p.Orders)/h.p.Rate*float64(time.Second))*3+2*time.Minute)
	defer cancelLoad()
	res, loadErr := loadgen.Run(loadCtx, sys.Client, skus, loadgen.Plan{
		Orders: h.p.Orders, Concurrency: loadConcurrency, DoubleSubmit: loadDoubleSubmit, DeclineEvery: loadDeclineEvery, Seed: h.seed, Rate: h.p.Rate,
		OnPaid: func(loadgen.Order) {
			n := paid.Add(1)
			// The second control sends no hostile message: its
			// double-applies must come from the crash windows alone.
			if n == int64(h.p.Orders/10) && (h.inbox || h.guard) {
				hostileOnce.Do(func() {
					go func() {
						err := hostile.build(ctx)
						if err == nil {
							h.noteHostile(hostile.ids())
							err = hostile.send(ctx)
						}
						if err != nil {
							h.say("sending hostile messages: %v", err)
						} else {
							h.say("sent hostile messages: %s", hostile.summary())
						}
					}()
				})
			}
			if slices.Contains(pgAt, n) {
				go h.restartPostgres(ctx)
			}
			if h.apache != nil && slices.Contains(clusterAt, n) {
				h.apache.restartCluster()
			}
			if i := slices.Index(failAt, n); i >= 0 {
				h.failovers.start(ctx, failoverKinds[i%len(failoverKinds)]) // one at a time, in turn
			}
		},
	})
	if loadErr == nil {
		res, loadErr = h.topUp(ctx, sys, skus, res)
	}
	if loadErr != nil {
		return nil, fmt.Errorf("load: %w", loadErr)
	}
	h.say("load done: %d orders paid (%d paid twice at once, %d client retries)", len(res.Paid), res.DoubleSubmits, res.Retries)

	// Drain: no more arming, random kills or broker faults. Armed processes
	// still alive may fire; the supervisor restarts them unarmed.
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
	stopChaos()
	wg.Wait()
	if h.failovers != nil {
		h.say("waiting for the last failover")
		h.failovers.wait()
	}
	for _, w := range h.probes {
		h.say("probe stream %s", w.summary())
	}
	// The drain lasts as long as the system makes progress: it ends when
	// nothing moved for the profile's Drain (a stall the services did not
	// end themselves), or after three times that in all. A slow machine
	// still working through its backlog is not judged unfinished.
	h.say("draining: chaos stopped, waiting for every paid order to settle")
	drainCtx, cancelDrain := context.WithTimeout(ctx, 3*h.p.Drain)
	defer cancelDrain()
	settled := judge.Settled(len(res.Paid))
	var moved string
	lastMove := time.Now()
	client := res.Client()
	client.Injected = hostile.injected()
	final, waitErr := judge.Wait(drainCtx, sys.Pools["orders"], sys.Pools["inventory"], stock, client,
		func(r judge.Report) bool {
			if now := fmt.Sprint(r.Reserved, r.Rejected, r.Ended, r.OutboxPending, r.CapturesPending); now != moved {
				moved, lastMove = now, time.Now()
			} else if time.Since(lastMove) > h.p.Drain {
				cancelDrain()
			}
			// The second control run sends no hostile message: nothing to wait for.
			return settled(r) && (!h.inbox && !h.guard || hostile.done(drainCtx))
		},
		func(r judge.Report) {
			h.say("draining: %d of %d settled, %d of %d captured ended, outbox pending %v (last progress %s ago)", r.Reserved+r.Rejected, r.OrdersPaid,
				r.Ended, r.Ended+r.NotEnded, r.OutboxPending, time.Since(lastMove).Round(time.Second))
		})
	if waitErr != nil {
		h.say("drain ended with nothing moving for %s (or after %s in all): judging the state as it is", h.p.Drain, 3*h.p.Drain)
		stopSupervising() // what is dumped stays down: the state judged is the drain's
		h.diagnoseStall(ctx)
	}
	// The third row: the provider's ledger against the orders.
	if h.payments, err = judge.CheckPayments(ctx, sys.Pools["orders"], sys.Pools["provider"]); err != nil {
		return nil, fmt.Errorf("reading the payments: %w", err)
	}
	final.Invariants = append(final.Invariants, h.payments.Invariant)
	h.audit = h.measureAudit(ctx, sys, client.Injected)
	// Settled says nothing of copies still in Kafka (a relay's last
	// republish): wait until no delivery has been traced for 3 s, so the
	// attribution judges copies that were handed out.
	h.say("judging: waiting for the last traced delivery, then the checks")
	h.waitQuiet(ctx, 3*time.Second, time.Minute)
	stopSupervising()
	if err := sys.StopServices(30 * time.Second); err != nil {
		h.say("graceful stop: %v", err)
	}
	return h.report(ctx, final, hostile)
}

// The load's shape, the same in its top-up: clients at once, every Nth
// order paid twice at once, every Nth paid with a declined card.
const (
	loadConcurrency  = 16
	loadDoubleSubmit = 25
	loadDeclineEvery = 50
)

// topUpRounds bounds the load's top-up (topUp): at most this many rounds.
const topUpRounds = 5

// topUp goes on with the load while the run is short of the reach its
// profile asks for (short), a tenth of its orders at a time (at least
// three grace periods' worth), at most topUpRounds times, faults still on. The orders are a minimum,
// not the measure: what a run must reach is its kills, and how many a
// given number of orders meets depends on the machine's pace and on the
// stalls the faults make (a failover leaves the services without a
// primary for 20 s); a run that ended short would fail faults-bit for
// what it did not try, not for what the system did (CI at f3967a6:
// failover-async with a standby, after-effect-before-record fired 4 < 5).
// A control built to fail needs its flaw's failure, not the reach: it is
// not topped up.
func (h *harness) topUp(ctx context.Context, sys *system.System, skus []string, res loadgen.Result) (loadgen.Result, error) {
	if h.mustFail() {
		return res, nil
	}
	// Each round lasts at least three of the longest grace periods, so
	// the incarnations armed in it live to meet their windows.
	n := max(h.p.Orders/10, int(h.p.Rate*3*h.p.GraceMax.Seconds()), 1)
	for round := 1; round <= topUpRounds; round++ {
		short := h.short()
		if len(short) == 0 {
			return res, nil
		}
		h.say("load: short of the profile's reach (%s): %d more orders (top-up %d of at most %d)", strings.Join(short, ", "), n, round, topUpRounds)
		loadCtx, cancel := context.WithTimeout(ctx, time.Duration(float64(n)/h.p.Rate*float64(time.Second))*3+time.Minute)
		more, err := loadgen.Run(loadCtx, sys.Client, skus, loadgen.Plan{
			Orders: n, Concurrency: loadConcurrency, DoubleSubmit: loadDoubleSubmit, DeclineEvery: loadDeclineEvery, Seed: h.seed + uint64(round), Rate: h.p.Rate})
		cancel()
		res = res.Add(more)
		if err != nil {
			return res, err
		}
	}
	if short := h.short(); len(short) > 0 {
		h.say("load: still short of the profile's reach after %d top-ups (%s): faults-bit will say so", topUpRounds, strings.Join(short, ", "))
	}
	return res, nil
}

// short names what the run has not reached yet of its profile's kills:
// each window its services can reach, and the kills in all, as the
// failpoint log counts them so far (judge.FaultsBitVerdict judges the
// same at the end, on the kills the trace proves).
func (h *harness) short() []string {
	fired := h.readFired()
	var short []string
	total := int(h.randomKills.Load())
	for _, w := range failpoint.All {
		total += fired[w]
		if reached(w, h.inbox) && fired[w] < h.p.MinPerWindow {
			short = append(short, fmt.Sprintf("%s fired %d of %d", w, fired[w], h.p.MinPerWindow))
		}
	}
	if total < h.p.MinKills {
		short = append(short, fmt.Sprintf("%d kills of %d", total, h.p.MinKills))
	}
	return short
}

// mustFail reports a control run the Makefile requires to fail (the inbox
// and the guard off, captures without their key, parallel relays,
// asynchronous failovers without a standby to wait for).
func (h *harness) mustFail() bool {
	return !h.inbox && !h.guard || !h.keys || h.p.RelayParallel || h.p.Failover == "async" && h.p.Standbys == 0
}

// waitQuiet waits until the failpoint log has not grown for quiet, or for
// at most limit.
func (h *harness) waitQuiet(ctx context.Context, quiet, limit time.Duration) {
	size := func() int64 {
		fi, err := os.Stat(h.fpLog)
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	deadline := time.Now().Add(limit)
	last, since := size(), time.Now()
	for time.Since(since) < quiet && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		if n := size(); n != last {
			last, since = n, time.Now()
		}
	}
}

// restartPoints spreads n Postgres restarts over the load.
func restartPoints(orders, n int) []int64 {
	var at []int64
	for i := 1; i <= n; i++ {
		at = append(at, int64(orders*i/(n+1)))
	}
	return at
}

func (h *harness) restartPostgres(ctx context.Context) {
	if h.sys.PG.External() {
		h.say("postgres is external (DATABASE_URL): not restarting it")
		return
	}
	h.say("restarting postgres (pg_ctl restart -m immediate)")
	if err := h.sys.PG.Restart(ctx); err != nil {
		h.say("postgres restart failed: %v", err)
		return
	}
	h.pgRestarts.Add(1)
	h.say("postgres is back")
}

// supervise restarts every process that dies, after a short random delay.
func (h *harness) supervise(ctx context.Context) {
	for _, p := range h.sys.All() {
		go func(p *procs.Proc) {
			for {
				select {
				case <-ctx.Done():
					return
				case <-p.Exited():
				}
				h.exited(p)
				if ctx.Err() != nil {
					return
				}
				if err := p.ExitStatus(); err != nil && !killed(err) {
					h.say("%s exited on its own: %v (restarting)", p.Name, err)
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(h.randDuration(100*time.Millisecond, 500*time.Millisecond)):
				}
				if err := p.Start(); err != nil {
					h.say("restarting %s: %v", p.Name, err)
					return
				}
				h.started(p)
				h.restarts.Add(1)
			}
		}(p)
	}
}

func killed(err error) bool {
	return err != nil && strings.Contains(err.Error(), "signal: killed")
}

// killRandomly SIGKILLs a random live process every RandomKill on average.
func (h *harness) killRandomly(ctx context.Context) {
	all := h.sys.All()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(h.randDuration(h.p.RandomKill/2, h.p.RandomKill*3/2)):
		}
		// The incarnation that has lived longest: an unarmed one, or one
		// armed with a window its traffic has not met yet, would otherwise
		// live on, and a run's kills would vary with chance (144 to 193 in
		// runs of the ci profile with the same seed).
		h.mu.Lock()
		p := all[h.rng.IntN(len(all))]
		for _, q := range all {
			if h.born[q.Name].Before(h.born[p.Name]) {
				p = q
			}
		}
		h.mu.Unlock()
		if p.Signal(syscall.SIGKILL) == nil {
			h.randomKills.Add(1)
		}
	}
}

// started records which service a new incarnation's pid belongs to.
func (h *harness) started(p *procs.Proc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pids[p.Pid()] = p.Service
	h.born[p.Name] = time.Now()
}

// readFired reads the failpoint log's kills and counts them (countFired).
func (h *harness) readFired() map[failpoint.Name]int {
	l, _ := judge.ReadLog(h.fpLog, false) // what could be read: a count for the progress line and arming
	return h.countFired(l)
}

// noteHostile records the hostile messages' subjects, once they are made
// and before the first is sent: from then on a kill on one is no meeting of
// its window (countFired).
func (h *harness) noteHostile(ids map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hostile = ids
}

// countFired counts the kills per window, and refreshes the per-service
// counts arm balances on (the system's own messages only).
func (h *harness) countFired(l judge.Log) map[failpoint.Name]int {
	counts := map[failpoint.Name]int{}
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.fired)
	for _, k := range l.Kills {
		counts[k.Window]++
		// A kill on a hostile message is not a meeting: attribution counts
		// it apart, so a window a service met only that way is still
		// unmet (after-commit-before-ack must meet each consumer's own).
		if !h.hostile[k.Subject] {
			h.fired[svcWindow{h.pids[k.Pid], k.Window}]++
		}
	}
	return counts
}

func joinNames(names []failpoint.Name) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ",")
}

// progress prints a line every five seconds while the load runs: the
// phase, orders paid of the profile's, the time left at the pace so far,
// and the faults so far.
func (h *harness) progress(ctx context.Context) {
	loadStart := time.Now()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fired := h.readFired()
		total := 0
		for _, n := range fired {
			total += n
		}
		var paid, settled int
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		err := h.sys.Pools["orders"].QueryRow(qctx, `
			SELECT count(*) FILTER (WHERE status <> 'created'), count(*) FILTER (WHERE status IN ('reserved', 'rejected'))
			FROM orders`).Scan(&paid, &settled)
		cancel()
		db := fmt.Sprintf("load: paid %d of %d (%d%%)%s, settled %d", paid, h.p.Orders, 100*paid/max(1, h.p.Orders), progress.Left(paid, h.p.Orders, time.Since(loadStart)), settled)
		if err != nil {
			db = "load: database unavailable"
		}
		netFaults := ""
		if h.net != nil {
			netFaults = fmt.Sprintf(" | network faults %d", h.net.total())
		}
		h.say("%s | kills: %d at windows, %d random | restarts %d | postgres restarts %d | broker faults %d%s",
			db, total, h.randomKills.Load(), h.restarts.Load(), h.pgRestarts.Load(), h.faults.total(), netFaults)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "OFF (control run)"
}

// readKafka reads everything the run's topics hold (the events', the dead
// letters' and the probe streams'). The cluster may still be electing
// leaders after the last fault: it tries for a minute before giving up on
// the run.
func (h *harness) readKafka(ctx context.Context) ([]judge.Record, error) {
	topics := append(append([]string(nil), system.Topics...), probeTopics()...)
	for try := 0; ; try++ {
		records, err := judge.ReadTopics(ctx, h.sys.Kafka.DirectBrokers(), topics...)
		if err == nil || try == 12 {
			return records, err
		}
		h.say("reading Kafka: %v (trying again)", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// readFlows reads each event topic's flow from its producer's outbox to
// its consumer's inbox, and its group's committed offsets, as they stand
// after the run (judge.ReadFlow).
func (h *harness) readFlows(ctx context.Context) ([]judge.FlowState, error) {
	var flows []judge.FlowState
	for _, f := range []struct{ topic, producer, consumer string }{
		{events.TopicOrders, "orders", "inventory"},
		{events.TopicInventory, "inventory", "orders"},
	} {
		lags, err := judge.GroupLag(ctx, h.sys.Kafka.DirectBrokers(), f.consumer, f.topic)
		if err != nil {
			return nil, fmt.Errorf("reading group %s's offsets: %w", f.consumer, err)
		}
		st, err := judge.ReadFlow(ctx, judge.Flow{Topic: f.topic, Producer: h.sys.Pools[f.producer], Consumer: h.sys.Pools[f.consumer], Name: f.consumer}, lags)
		if err != nil {
			return nil, err
		}
		flows = append(flows, st)
	}
	return flows, nil
}

// diagnoseStall says, when the drain missed its deadline, where each
// consumer group stands on every partition (the judge's own Kafka client)
// and asks every service process for its goroutines (SIGQUIT: the Go
// runtime writes them to the process's log and exits), so a stalled
// partition can be traced to the code it waits in.
func (h *harness) diagnoseStall(ctx context.Context) {
	for _, svc := range system.Services {
		group, topic := svc, events.TopicOrders // inventory reads what orders writes
		if svc == "orders" {
			topic = events.TopicInventory
		}
		lags, err := judge.GroupLag(ctx, h.sys.Kafka.DirectBrokers(), group, topic)
		if err != nil {
			h.say("group %s: reading its lag: %v", group, err)
			continue
		}
		for _, l := range lags {
			h.say("group %s", l)
		}
		h.lags = append(h.lags, lags...)
	}
	for _, p := range h.sys.All() {
		if err := p.Signal(syscall.SIGQUIT); err == nil {
			h.say("%s: goroutines dumped to its log (SIGQUIT)", p.Name)
		}
	}
}

// measureAudit waits until the auditor beside the run has caught up with
// it and judges what it found (judge.AuditAlarms): late work resolved in
// time is no alarm, a breach is.
func (h *harness) measureAudit(ctx context.Context, sys *system.System, injected []string) AuditRow {
	if sys.Auditor == nil {
		return AuditRow{Detail: "no auditor", Verdict: judge.Invariant{Name: judge.AuditAlarms, OK: true, Detail: "not judged: no auditor ran"}}
	}
	actx, cancel := context.WithTimeout(ctx, sys.AuditGrace+2*time.Minute)
	defer cancel()
	findings, err := judge.AuditAfter(actx, sys.Pools["audit"], sys.AuditGrace)
	if err != nil {
		h.say("auditor: %v", err)
		return AuditRow{Detail: err.Error(), Verdict: judge.Invariant{Name: judge.AuditAlarms, Detail: "the auditor did not catch up with the run: " + err.Error()}}
	}
	row := AuditRow{Findings: len(findings), Kinds: map[string]int{}, Detail: judge.AuditVerdict(findings).Detail,
		Verdict: judge.AuditAlarmsVerdict(findings, sys.AuditGrace, setOf(injected))}
	for _, f := range findings {
		row.Kinds[f.Check+"/"+f.Kind]++
		if f.Open() {
			row.Open++
		}
	}
	h.say("auditor: %s", row.Verdict.Detail)
	return row
}

// setOf is the set of ids.
func setOf(ids []string) map[string]bool {
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}
