package main

// The faults benchmark (bench -faults; #29 item 5): how the relay keeps up
// when the cluster under it loses a broker and its partitions change
// leaders. pkg/outbox's Relay with outboxkafka's Publisher, as the services
// run it (relay_1 of the relay benchmark), publishes a steady offered rate
// of outbox rows (every 10 ms, the rows then due in one transaction) to a
// topic on a 3-node Apache Kafka cluster (replication factor 3,
// min.insync.replicas 2, the producer waiting for all in-sync replicas),
// through four phases of equal length, one after another, with a gap
// before each fault that no phase counts (the rows committed just before
// a fault are held up by it):
//
//   - quiet:         nothing is done to the cluster;
//   - broker_kill:   at its start the node leading the most partitions of
//     the topic is SIGKILLed; it stays down DownS seconds and is started
//     again on its data;
//   - leader_change: at its start a preferred-leader election (what
//     kafka-leader-election.sh --election-type preferred does) gives the
//     partitions the killed node led back to it, retried every 500 ms until
//     its replicas are in sync again: leaders change on a live cluster (a
//     round whose election moves nothing fails);
//   - after:         nothing is done; has everything recovered.
//
// A consumer of its own reads the topic throughout. For each phase: the
// offered rate (rows committed in it, per second), the published rate
// (messages first read in it, per second), commit→read latency of the rows
// committed in it, commit→acked (the relay's part: until its publisher
// returned, Kafka having acknowledged the message), and the backlog
// (committed, not yet read), sampled ten times a second, at the phase's
// start, end and peak. A phase is sustainable when the offered rate was
// met (published ≥ 95% of offered), nothing was lost, and the backlog
// stopped growing (at its end no more than a quarter second of the offered
// rate above its start). After a fault, recovered is the time from the
// fault until the backlog, past its peak, was back within the quiet
// phase's peak (or a tenth of a second of load, if more).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/progress"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// faultParams sizes the faults benchmark.
type faultParams struct {
	Rate       float64 `json:"rate"`          // rows/s committed to the outbox, throughout
	WarmS      float64 `json:"warmup_s"`      // seconds at that rate before the first phase, not measured
	PhaseS     float64 `json:"phase_s"`       // seconds of each phase
	GapS       float64 `json:"gap_s"`         // seconds before a fault, counted in no phase: the rows committed just before it are held up by it
	DownS      float64 `json:"broker_down_s"` // seconds the killed node stays down
	Partitions int     `json:"partitions"`
	Keys       int     `json:"keys"`
	Nodes      int     `json:"nodes"`
	Rounds     int     `json:"rounds"`
}

// The phases, in the order they run.
const (
	phaseQuiet        = "quiet"
	phaseBrokerKill   = "broker_kill"
	phaseLeaderChange = "leader_change"
	phaseAfter        = "after"
)

var faultPhases = []string{phaseQuiet, phaseBrokerKill, phaseLeaderChange, phaseAfter}

// FaultPhase is one phase's figures (medians over rounds).
type FaultPhase struct {
	Phase         string      `json:"phase"`
	Did           string      `json:"did"` // what was done to the cluster, in the last round
	OfferedPerS   float64     `json:"offered_msgs_per_s"`
	PublishedPerS float64     `json:"published_msgs_per_s"`
	LatencyMS     Percentiles `json:"commit_to_read_ms"`
	MaxMS         float64     `json:"commit_to_read_max_ms"`
	// RelayMS is the relay's part of the hop: from the row's commit until
	// the relay's publisher returned, Kafka having acknowledged it.
	RelayMS      Percentiles `json:"commit_to_acked_ms"`
	RelayMaxMS   float64     `json:"commit_to_acked_max_ms"`
	Unread       int         `json:"unread"` // committed in the phase and never read: lost
	BacklogStart int         `json:"backlog_start"`
	BacklogEnd   int         `json:"backlog_end"`
	BacklogPeak  int         `json:"backlog_peak"`
	// RecoveredS is, for a phase that begins with a fault, the seconds
	// from the fault until the backlog was back within the quiet phase's
	// peak; -1 when it was not within the phase.
	RecoveredS    float64 `json:"recovered_after_s"`
	LeaderChanges int     `json:"leader_changes"` // partitions whose leader the phase's fault moved
	// LeadersMovedS (broker_kill): seconds from the kill until the dead
	// node led no partition of the topic; the relay's stall beyond it is
	// the client's.
	LeadersMovedS float64   `json:"leaders_moved_after_s,omitempty"`
	Sustainable   bool      `json:"sustainable"`
	ByRound       []float64 `json:"published_msgs_per_s_by_round"`
	SustainedBy   []bool    `json:"sustainable_by_round"`
	DidByRound    []string  `json:"did_by_round,omitempty"`
}

// FaultReport is bench-faults-report.json.
type FaultReport struct {
	When    string            `json:"when"`
	Machine map[string]string `json:"machine"`
	Kafka   string            `json:"kafka"`
	Params  faultParams       `json:"params"`
	Phases  []FaultPhase      `json:"phases"`
	// Ratios per phase beside quiet: published/offered, and p99 over the
	// quiet phase's p99 (medians of each round's ratio).
	Ratios map[string]float64 `json:"ratios"`
	Notes  string             `json:"notes"`
}

// faultRound is what one round recorded: every row's commit and first read,
// the backlog samples, and each phase's start and what was done in it.
type faultRound struct {
	committed map[string]time.Time
	read      map[string]time.Time
	acked     map[string]time.Time // when the relay's publisher returned
	samples   []backlogSample
	starts    []time.Time // each phase's start
	ends      []time.Time // and end: before a fault, a gap no phase counts
	did       []string
	moved     []int
	// leadersMovedS: seconds from the kill until the dead node led none of
	// the topic's partitions (-1: not while it was down).
	leadersMovedS float64
}

type backlogSample struct {
	at      time.Time
	backlog int
}

func runFaultBench(ctx context.Context, smoke bool, rounds int, say func(string, ...any)) error {
	p := faultParams{Rate: 500, WarmS: 10, PhaseS: 20, GapS: 3, DownS: 10, Partitions: 12, Keys: 1000, Nodes: 3, Rounds: max(1, rounds)}
	if smoke {
		p.WarmS, p.PhaseS, p.GapS, p.DownS, p.Rounds = 2, 8, 2, 4, 1
	}
	if _, _, err := stack.ApacheRuntime(ctx, say); err != nil {
		if smoke && os.Getenv("REQUIRE_APACHE_KAFKA") == "" {
			say("faults benchmark: skipped, it needs Apache Kafka (a 3-node cluster): %v", err)
			return nil
		}
		return fmt.Errorf("the faults benchmark needs Apache Kafka (a 3-node cluster): %w", err)
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck
	say("faults benchmark: %+v; starting a %d-node Apache Kafka cluster", p, p.Nodes)
	k, err := stack.StartKafka(ctx, stack.KafkaOptions{Impl: stack.ImplApache, Nodes: p.Nodes, Partitions: p.Partitions,
		Apache: stack.ApacheOptions{Log: say}})
	if err != nil {
		return err
	}
	defer k.Close()
	rep := FaultReport{When: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Kafka: k.Describe(), Params: p,
		Ratios: map[string]float64{}}
	var recorded []faultRound
	began := time.Now()
	for round := range p.Rounds {
		say("[round %d of %d%s]", round+1, p.Rounds, progress.Left(round, p.Rounds, time.Since(began)))
		r, err := faultRoundRun(ctx, pg, k, p, round, say)
		if err != nil {
			return fmt.Errorf("round %d: %w", round+1, err)
		}
		recorded = append(recorded, r)
		for _, ph := range phaseFigures(r, p) {
			say("  %-13s offered %4.0f/s published %4.0f/s, commit→read p50 %6.1f p99 %7.1f max %7.1f ms (commit→acked p99 %7.1f max %7.1f), backlog %d→%d (peak %d), recovered %s, sustainable %t",
				ph.Phase, ph.OfferedPerS, ph.PublishedPerS, ph.LatencyMS.P50, ph.LatencyMS.P99, ph.MaxMS, ph.RelayMS.P99, ph.RelayMaxMS,
				ph.BacklogStart, ph.BacklogEnd, ph.BacklogPeak, recoveredText(ph), ph.Sustainable)
		}
	}
	rep.Phases, rep.Ratios = medianPhases(recorded, p)
	rep.Notes = "One machine, 2 cores: three broker JVMs, Postgres, the relay and the reader share it. " +
		"The test bed's brokers fence a dead node after broker.session.timeout.ms=3000 (Kafka's default is 9000): " +
		"on a cluster at its defaults the partitions a dead node led wait three times as long for a new leader. " +
		"The relay publishes with acks=all and min.insync.replicas=2 of 3, so with one node down every partition is writable once its leader moved. " +
		"The reader is the benchmark's own (franz-go, metadata re-read at most every 500 ms); commit→acked, until the relay's publisher returned, is the relay's part alone."
	printFaults(rep, say)
	// Reported, not enforced: one noisy machine's figures.
	return writeReport(rep, "BENCH_FAULTS_REPORT", "bench-faults-report.json", say)
}

// faultRoundRun runs the four phases once, on a fresh database and topic.
func faultRoundRun(ctx context.Context, pg *pgtest.Server, k *stack.Kafka, p faultParams, round int, say func(string, ...any)) (faultRound, error) {
	c := k.Apache()
	r := faultRound{committed: map[string]time.Time{}}
	name := fmt.Sprintf("faultbench_r%d_%d", round, time.Now().UnixNano()%1_000_000)
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		return r, err
	}
	defer dropDatabases(pg, name)
	if err := k.CreateTopics(ctx, p.Partitions, name); err != nil {
		return r, err
	}
	b, err := newRelayBuild(ctx, url, k.Brokers(), "relay_1", name)
	if err != nil {
		return r, err
	}
	defer b.close()
	rd, err := newReader(k.Brokers(), name)
	if err != nil {
		return r, err
	}
	defer rd.close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := b.start(runCtx)

	// The writer commits at the rate from the warm-up to the end of the
	// last phase, every 10 ms the rows then due in one transaction (one a
	// transaction could not keep 500/s beside three broker JVMs on two
	// cores); the sampler notes the backlog meanwhile.
	phase := time.Duration(p.PhaseS * float64(time.Second))
	var mu sync.Mutex
	var nCommitted atomic.Int64
	writeCtx, stopWriting := context.WithCancel(ctx) // after the last phase
	defer stopWriting()
	writeErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		began, written := time.Now(), 0
		for {
			select {
			case <-writeCtx.Done():
				writeErr <- nil
				return
			case <-tick.C:
			}
			due := min(int(p.Rate*time.Since(began).Seconds())-written, 100)
			if due <= 0 {
				continue
			}
			_, err := b.write(writeCtx, due, p.Keys, func(id string, at time.Time) {
				mu.Lock()
				r.committed[id] = at
				mu.Unlock()
				nCommitted.Add(1)
			})
			if err != nil && writeCtx.Err() == nil {
				writeErr <- err
				return
			}
			written += due
		}
	}()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case now := <-t.C:
				s := backlogSample{at: now, backlog: int(nCommitted.Load()) - rd.count()}
				mu.Lock()
				r.samples = append(r.samples, s)
				mu.Unlock()
			}
		}
	}()

	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-writeErr:
			if err == nil { // stopped with ctx
				return errors.New("the writer stopped")
			}
			return fmt.Errorf("writing: %w", err)
		case <-time.After(d):
			return nil
		}
	}
	if err := wait(time.Duration(p.WarmS * float64(time.Second))); err != nil {
		return r, err
	}
	var killed *stack.KafkaNode
	for i, ph := range faultPhases {
		var leaders map[int32]int
		if ph == phaseBrokerKill { // read before the phase: it begins with the kill
			if leaders, err = c.Leaders(name); err != nil {
				return r, err
			}
		}
		start := time.Now()
		mu.Lock()
		r.starts = append(r.starts, start)
		mu.Unlock()
		did, moved := "nothing", 0
		switch ph {
		case phaseBrokerKill:
			victim, led := mostLeading(leaders)
			killed = c.Node(victim)
			killed.Kill()
			say("  %s: node %d SIGKILLed, leader of %d of %d partitions", ph, victim, led, len(leaders))
			// When the cluster moved the dead node's partitions: from then
			// on, what keeps the relay waiting is the client's.
			movedAt := make(chan time.Duration, 1)
			go func() {
				for time.Since(start) < time.Duration(p.DownS*float64(time.Second)) {
					now, err := c.Leaders(name)
					if err == nil && len(now) == len(leaders) && !slices.Contains(slices.Collect(maps.Values(now)), victim) {
						movedAt <- time.Since(start)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				movedAt <- -1
			}()
			if err := wait(time.Duration(p.DownS * float64(time.Second))); err != nil {
				return r, err
			}
			r.leadersMovedS = (<-movedAt).Seconds()
			// Back on its data; the phase lasts until the cluster answers
			// again, if that takes longer than the phase.
			if err := killed.Start(); err != nil {
				return r, fmt.Errorf("restarting node %d: %w", victim, err)
			}
			if err := c.WaitReady(ctx); err != nil {
				return r, fmt.Errorf("node %d back: %w", victim, err)
			}
			moved = led
			did = fmt.Sprintf("node %d SIGKILLed, leader of %d of %d partitions, led by others %.1f s later; started again after %.0f s, the cluster ready %.1f s after the kill",
				victim, led, len(leaders), r.leadersMovedS, p.DownS, time.Since(start).Seconds())
			say("  %s: %s", ph, did)
		case phaseLeaderChange:
			// The node's replicas catch up first; until then the election
			// answers that the preferred leader is not available.
			elected, tries := 0, 0
			for time.Since(start) < phase-time.Second {
				tries++
				e, notYet, err := c.ElectPreferredLeaders(name)
				if err != nil {
					return r, err
				}
				elected += e
				if notYet == 0 {
					break
				}
				if err := wait(500 * time.Millisecond); err != nil {
					return r, err
				}
			}
			if elected == 0 {
				return r, fmt.Errorf("the preferred-leader election moved no partition back to node %d in %d tries: the leader_change phase would change nothing", killed.ID, tries)
			}
			moved = elected
			did = fmt.Sprintf("preferred-leader election: %d partitions moved back to node %d, their preferred replica (%d tries, %.1f s into the phase)",
				elected, killed.ID, tries, time.Since(start).Seconds())
			say("  %s: %s", ph, did)
		}
		r.did, r.moved = append(r.did, did), append(r.moved, moved)
		if err := wait(phase - time.Since(start)); err != nil {
			return r, err
		}
		mu.Lock()
		r.ends = append(r.ends, time.Now())
		mu.Unlock()
		if i+1 < len(faultPhases) && faultPhases[i+1] != phaseAfter {
			if err := wait(time.Duration(p.GapS * float64(time.Second))); err != nil {
				return r, err
			}
		}
	}
	stopWriting()
	if err := <-writeErr; err != nil {
		return r, fmt.Errorf("writing: %w", err)
	}
	// The last rows get their chance to be read; those never read are lost.
	mu.Lock()
	ids := make([]string, 0, len(r.committed))
	for id := range r.committed {
		ids = append(ids, id)
	}
	mu.Unlock()
	if err := rd.waitFor(ctx, ids, 30*time.Second); err != nil {
		say("  %v", err)
	}
	stopSampling()
	<-sampled
	r.read = rd.snapshot()
	r.acked = b.acked.snapshot()
	stop()
	<-done
	return r, nil
}

// mostLeading returns the node leading the most partitions, and how many.
func mostLeading(leaders map[int32]int) (node, led int) {
	count := map[int]int{}
	for _, n := range leaders {
		count[n]++
	}
	for n, c := range count {
		if c > led || c == led && n < node {
			node, led = n, c
		}
	}
	return node, led
}

// phaseFigures computes each phase's figures from what a round recorded.
func phaseFigures(r faultRound, p faultParams) []FaultPhase {
	var out []FaultPhase
	quietPeak := 0
	for i, name := range faultPhases {
		if i >= len(r.ends) {
			break
		}
		t0, t1 := r.starts[i], r.ends[i]
		dur := t1.Sub(t0).Seconds()
		ph := FaultPhase{Phase: name, RecoveredS: -1}
		if i < len(r.did) {
			ph.Did, ph.LeaderChanges = r.did[i], r.moved[i]
		}
		if name == phaseBrokerKill {
			ph.LeadersMovedS = r.leadersMovedS
		}
		in := func(at time.Time) bool { return !at.Before(t0) && at.Before(t1) }
		var waits, relayWaits []float64
		offered := 0
		for id, at := range r.committed {
			if !in(at) {
				continue
			}
			offered++
			if m, ok := r.acked[id]; ok {
				relayWaits = append(relayWaits, float64(m.Sub(at).Microseconds())/1000)
			}
			if read, ok := r.read[id]; ok {
				waits = append(waits, float64(read.Sub(at).Microseconds())/1000)
			} else {
				ph.Unread++
			}
		}
		published := 0
		for _, at := range r.read {
			if in(at) {
				published++
			}
		}
		ph.OfferedPerS, ph.PublishedPerS = float64(offered)/dur, float64(published)/dur
		if len(waits) > 0 {
			ph.LatencyMS = percentiles(waits)
			ph.MaxMS = slices.Max(waits)
		}
		if len(relayWaits) > 0 {
			ph.RelayMS = percentiles(relayWaits)
			ph.RelayMaxMS = slices.Max(relayWaits)
		}
		first := true
		for _, s := range r.samples {
			if !in(s.at) {
				continue
			}
			if first {
				ph.BacklogStart, first = s.backlog, false
			}
			ph.BacklogEnd = s.backlog
			ph.BacklogPeak = max(ph.BacklogPeak, s.backlog)
		}
		switch name {
		case phaseQuiet:
			// Back to normal: within the quiet phase's peak, or a tenth of
			// a second of load, whichever is more.
			quietPeak = max(ph.BacklogPeak, int(p.Rate/10))
			ph.RecoveredS = 0
		case phaseBrokerKill, phaseLeaderChange:
			ph.RecoveredS = recovered(r.samples, t0, t1, quietPeak)
		default:
			ph.RecoveredS = 0 // no fault to recover from
		}
		ph.Sustainable = ph.PublishedPerS >= 0.95*ph.OfferedPerS && ph.Unread == 0 &&
			float64(ph.BacklogEnd) <= float64(ph.BacklogStart)+p.Rate/4
		ph.ByRound, ph.SustainedBy = []float64{ph.PublishedPerS}, []bool{ph.Sustainable}
		out = append(out, ph)
	}
	return out
}

// recovered is the seconds from t0 until the backlog, past its peak in
// [t0, t1), was first back within limit; -1 if it was not by t1. The
// noise of a quiet backlog after that is not counted against it.
func recovered(samples []backlogSample, t0, t1 time.Time, limit int) float64 {
	peak := -1
	var peakAt time.Time
	for _, s := range samples {
		if !s.at.Before(t0) && s.at.Before(t1) && s.backlog > peak {
			peak, peakAt = s.backlog, s.at
		}
	}
	if peak < 0 {
		return -1
	}
	if peak <= limit {
		return 0
	}
	for _, s := range samples {
		if s.at.After(peakAt) && s.at.Before(t1) && s.backlog <= limit {
			return s.at.Sub(t0).Seconds()
		}
	}
	return -1
}

// medianPhases is each phase's figures, median over rounds field by field,
// with the ratios beside the quiet phase.
func medianPhases(rounds []faultRound, p faultParams) ([]FaultPhase, map[string]float64) {
	byRound := make([][]FaultPhase, len(rounds))
	for i, r := range rounds {
		byRound[i] = phaseFigures(r, p)
	}
	ratios := map[string]float64{}
	var out []FaultPhase
	for i, name := range faultPhases {
		var all []FaultPhase
		for _, phs := range byRound {
			if i < len(phs) {
				all = append(all, phs[i])
			}
		}
		if len(all) == 0 {
			continue
		}
		med := func(f func(FaultPhase) float64) float64 {
			v := make([]float64, len(all))
			for j, ph := range all {
				v[j] = f(ph)
			}
			return median(v)
		}
		m := all[len(all)-1] // Did, LeaderChanges: the last round's (each round's Did in DidByRound)
		m.OfferedPerS = med(func(f FaultPhase) float64 { return f.OfferedPerS })
		m.PublishedPerS = med(func(f FaultPhase) float64 { return f.PublishedPerS })
		m.LatencyMS = Percentiles{med(func(f FaultPhase) float64 { return f.LatencyMS.P50 }),
			med(func(f FaultPhase) float64 { return f.LatencyMS.P95 }), med(func(f FaultPhase) float64 { return f.LatencyMS.P99 })}
		m.MaxMS = med(func(f FaultPhase) float64 { return f.MaxMS })
		m.RelayMS = Percentiles{med(func(f FaultPhase) float64 { return f.RelayMS.P50 }),
			med(func(f FaultPhase) float64 { return f.RelayMS.P95 }), med(func(f FaultPhase) float64 { return f.RelayMS.P99 })}
		m.RelayMaxMS = med(func(f FaultPhase) float64 { return f.RelayMaxMS })
		m.LeadersMovedS = medKnown(all, func(f FaultPhase) float64 { return f.LeadersMovedS })
		m.Unread = int(med(func(f FaultPhase) float64 { return float64(f.Unread) }))
		m.BacklogStart = int(med(func(f FaultPhase) float64 { return float64(f.BacklogStart) }))
		m.BacklogEnd = int(med(func(f FaultPhase) float64 { return float64(f.BacklogEnd) }))
		m.BacklogPeak = int(med(func(f FaultPhase) float64 { return float64(f.BacklogPeak) }))
		m.RecoveredS = medKnown(all, func(f FaultPhase) float64 { return f.RecoveredS })
		m.ByRound, m.SustainedBy, m.DidByRound = nil, nil, nil
		m.Sustainable = true
		var pubRatio, p99Ratio []float64
		for _, phs := range byRound {
			if i >= len(phs) {
				continue
			}
			ph := phs[i]
			m.ByRound = append(m.ByRound, ph.PublishedPerS)
			m.SustainedBy = append(m.SustainedBy, ph.Sustainable)
			m.DidByRound = append(m.DidByRound, ph.Did)
			m.Sustainable = m.Sustainable && ph.Sustainable
			if ph.OfferedPerS > 0 {
				pubRatio = append(pubRatio, ph.PublishedPerS/ph.OfferedPerS)
			}
			if q := phs[0].LatencyMS.P99; q > 0 {
				p99Ratio = append(p99Ratio, ph.LatencyMS.P99/q)
			}
		}
		if len(pubRatio) > 0 {
			ratios["published/offered@"+name] = median(pubRatio)
		}
		if name != phaseQuiet && len(p99Ratio) > 0 {
			ratios["p99_vs_quiet@"+name] = median(p99Ratio)
		}
		out = append(out, m)
	}
	return out, ratios
}

// medKnown is the median of f over the phases where it is known (not the
// -1 of "not within the phase"); -1 when it is known for none.
func medKnown(all []FaultPhase, f func(FaultPhase) float64) float64 {
	var v []float64
	for _, ph := range all {
		if x := f(ph); x >= 0 {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return -1
	}
	return median(v)
}

func recoveredText(ph FaultPhase) string {
	switch {
	case ph.Phase == phaseQuiet || ph.Phase == phaseAfter:
		return "-"
	case ph.RecoveredS < 0:
		return "not within the phase"
	}
	return fmt.Sprintf("after %.1f s", ph.RecoveredS)
}

func printFaults(rep FaultReport, say func(string, ...any)) {
	say("faults benchmark on %s, %.0f rows/s offered, phases of %.0f s (medians of %d rounds):", rep.Kafka, rep.Params.Rate, rep.Params.PhaseS, rep.Params.Rounds)
	say("  %-13s %9s %9s %8s %8s %8s %13s %14s %10s %s", "PHASE", "OFFERED/s", "PUBLISH/s", "P50 ms", "P99 ms", "MAX ms", "RELAY P99/MAX", "BACKLOG s→e^p", "RECOVERED", "SUSTAINABLE")
	for _, ph := range rep.Phases {
		say("  %-13s %9.0f %9.0f %8.1f %8.1f %8.1f %13s %14s %10s %t", ph.Phase, ph.OfferedPerS, ph.PublishedPerS, ph.LatencyMS.P50,
			ph.LatencyMS.P99, ph.MaxMS, fmt.Sprintf("%.0f/%.0f", ph.RelayMS.P99, ph.RelayMaxMS), fmt.Sprintf("%d→%d^%d", ph.BacklogStart, ph.BacklogEnd, ph.BacklogPeak),
			recoveredText(ph), ph.Sustainable)
		if ph.Did != "nothing" {
			say("  %-13s %s", "", ph.Did)
		}
	}
}
