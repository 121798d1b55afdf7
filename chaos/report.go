package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// Report is what a run writes with -report.
type Report struct {
	Seed                 uint64                         `json:"seed"`
	Profile              string                         `json:"profile"`
	Inbox                bool                           `json:"inbox"`
	Guard                bool                           `json:"guard"`
	Relay                string                         `json:"relay"` // the services' relays: one leader, sharded, or parallel (the ordering control)
	DurationS            float64                        `json:"duration_s"`
	OrdersPaid           int                            `json:"orders_paid"`
	Kills                map[string]int                 `json:"kills"` // crash window → SIGKILLs it caused
	RandomKills          int                            `json:"random_kills"`
	TotalKills           int                            `json:"total_kills"`
	Restarts             int                            `json:"restarts"`
	PostgresRestarts     int                            `json:"postgres_restarts"`
	Broker               string                         `json:"broker"`        // implementation and version
	BrokerFaults         map[string]int                 `json:"broker_faults"` // by class (and leader_changes they caused)
	BrokerKills          int                            `json:"broker_kills"`
	NetworkFaults        map[string]int                 `json:"network_faults"`        // "<postgres|kafka>_<kind>" → times applied
	Failovers            []failoverRow                  `json:"failovers"`             // the replicated Postgres's, in order (failover.go)
	Standbys             int                            `json:"standbys"`              // DATABASE_STANDBYS (-standbys): what leaves a transaction waited for this many standbys
	DuplicatesSuppressed int64                          `json:"duplicates_suppressed"` // caught by the inbox, the first layer
	Refused              map[string]int                 `json:"refused"`               // per service, caught by the domain guard, the second layer
	RefusedNotHostile    int                            `json:"refused_not_hostile"`   // of those, refusals of the system's own messages: redeliveries
	DoubleApplied        int                            `json:"double_applied"`
	Lost                 int                            `json:"lost"`         // paid orders a stage of which nothing will bring (judge.Unfinished)
	NotFinished          int                            `json:"not_finished"` // paid orders a stage of which was still on its way when the drain ended
	Invariants           map[string]bool                `json:"invariants"`
	Details              map[string]string              `json:"details"`
	Hostile              map[string]judge.HostileResult `json:"hostile"`
	Windows              []judge.WindowRow              `json:"windows"`
	Trace                judge.TraceRow                 `json:"trace"` // the failpoint trace checked against the model (chaos/judge/trace.go)
	// The crash windows' own double-applies (hostile messages excluded) and
	// the floor they must reach in the second control run: every copy that
	// met an effect committed before its kill (judge.JudgeWindows).
	CrashWindowDoubleApplied int `json:"crash_window_double_applied"`
	CrashWindowFloor         int `json:"crash_window_floor"`
	// The same for the effect windows: captures after-effect-before-record
	// kills made twice (only without keys), and the floor for the effect
	// control run: every such capture that was called again (judge.EffectVerdict).
	EffectKeys                 bool        `json:"effect_keys"`
	EffectAttribution          bool        `json:"effect_attribution"` // the effect windows' part of the attribution held
	EffectWindowDoubleCaptures int         `json:"effect_window_double_captures"`
	EffectWindowFloor          int         `json:"effect_window_floor"`
	Payments                   PaymentsRow `json:"payments"`
	// What the auditor running beside the run (services/auditor) found
	// once it caught up: measured, not judged yet.
	Audit AuditRow `json:"audit"`
	// What ordered-per-key found, per topic: the probe streams' and the
	// events' (judge.MeasureKeyOrder).
	OrderedPerKey []judge.TopicOrder `json:"ordered_per_key"`
	Passed        bool               `json:"passed"`
	// Failed names the invariants that failed, comma-separated ("" when
	// it passed), for a control run to show it failed for its reason.
	Failed string `json:"failed"`
}

// AuditRow is what the auditor found (judge.AuditAfter).
type AuditRow struct {
	Findings int            `json:"findings"` // raised, open or resolved
	Open     int            `json:"open"`
	Kinds    map[string]int `json:"kinds,omitempty"` // "check/kind" → findings
	Detail   string         `json:"detail"`
	// Verdict is judge.AuditAlarms's, which the report's invariants carry.
	Verdict judge.Invariant `json:"-"`
}

// PaymentsRow is what the provider's ledger holds (judge.CheckPayments).
type PaymentsRow struct {
	Captured      int `json:"captured"`       // reserved orders captured once
	Declined      int `json:"declined"`       // reserved orders declined once
	CapturedTwice int `json:"captured_twice"` // orders with more than one attempt
}

func (h *harness) report(ctx context.Context, final judge.Report, hostile *hostile) (*Report, error) {
	// The failpoint log, read once: the attribution and the trace check
	// both parse it.
	fpLog, err := os.ReadFile(h.fpLog)
	if err != nil {
		return nil, fmt.Errorf("reading the failpoint log: %w", err)
	}
	log, err := judge.ParseLog(bytes.NewReader(fpLog), true)
	if err != nil {
		return nil, fmt.Errorf("reading the failpoint log: %w", err)
	}
	h.countFired(log)                                                // the per-service counts arming balances on
	traced, err := judge.CheckTrace(bytes.NewReader(fpLog), h.inbox) // the trace against the model
	if err != nil {
		return nil, fmt.Errorf("checking the trace against the model: %w", err)
	}
	r := &Report{
		Seed: h.seed, Profile: h.p.Name, Inbox: h.inbox, Guard: h.guard, EffectKeys: h.keys, Relay: h.p.relay(), Standbys: h.p.Standbys, Refused: final.Refused,
		DurationS:            time.Since(h.start).Seconds(),
		OrdersPaid:           final.OrdersPaid,
		Kills:                map[string]int{},
		RandomKills:          int(h.randomKills.Load()),
		Restarts:             int(h.restarts.Load()),
		PostgresRestarts:     int(h.pgRestarts.Load()),
		Broker:               h.sys.Kafka.Describe(),
		BrokerFaults:         h.faults.counts(),
		NetworkFaults:        map[string]int{},
		DuplicatesSuppressed: final.DuplicatesSuppressed,
		DoubleApplied:        final.DoubleApplied,
		Lost:                 final.Unsettled + final.NotApplied + final.NotEnded,
		Invariants:           map[string]bool{},
		Details:              map[string]string{},
		Hostile:              map[string]judge.HostileResult{},
		Payments:             PaymentsRow{Captured: h.payments.Captured, Declined: h.payments.Declined, CapturedTwice: h.payments.CapturedTwice},
		Audit:                h.audit,
	}
	// Every verdict is chaos/judge's (its Rules); the driver gathers what
	// they read and assembles the report. The client's paid orders are
	// compared with the database's by id there (client-agrees), not by
	// count here: a count passes a run that lost one payment and invented
	// another.
	for _, inv := range final.Invariants {
		r.Invariants[inv.Name] = inv.OK
		r.Details[inv.Name] = inv.Detail
	}
	r.Invariants[judge.AuditAlarms], r.Details[judge.AuditAlarms] = h.audit.Verdict.OK, h.audit.Verdict.Detail
	r.Trace = judge.TraceRowOf(traced)
	r.Invariants[judge.TraceInModel], r.Details[judge.TraceInModel] = judge.TraceVerdict(traced)

	reach := judge.Reach{Kills: judge.ProvenKills(traced), RandomKills: r.RandomKills, PostgresRestarts: r.PostgresRestarts,
		Inbox: h.inbox, Suppressed: r.DuplicatesSuppressed}
	for _, w := range failpoint.All {
		r.Kills[string(w)] = reach.Kills[w]
		if reached(w, h.inbox) {
			reach.Reached = append(reach.Reached, w)
		}
	}
	if h.apache != nil {
		r.BrokerKills = h.apache.kills()
		bf := r.BrokerFaults
		reach.Apache, reach.BrokerKills = true, r.BrokerKills
		reach.LeaderChanges, reach.Pauses, reach.ClusterRestarts = bf[countLeaderChanges], bf[faultBrokerPaused], bf[faultClusterRestarted]
	}
	if h.net != nil {
		r.NetworkFaults = h.net.counts()
		reach.Net, reach.NetFaults, reach.NetKinds = true, h.net.total(), h.net.kinds()
	}
	least := judge.Minimums{PerWindow: h.p.MinPerWindow, Kills: h.p.MinKills, PostgresRestarts: h.p.PGRestarts,
		BrokerKills: h.p.MinBrokerKills, Pauses: h.p.MinPauses, ClusterRestarts: h.p.ClusterRestarts, Kinds: h.p.MinNetKinds}
	if h.failovers != nil {
		services := map[string]*pgxpool.Pool{}
		for _, svc := range system.Services {
			services[svc] = h.sys.Pools[svc]
		}
		if err := h.failovers.measure(ctx, services); err != nil {
			return nil, err
		}
		r.Failovers = h.failovers.report()
		for _, row := range r.Failovers {
			for _, svc := range system.Services {
				if st, ok := row.Stalls[svc]; ok {
					h.say("postgres: %s (%s → %s, %.1fs without a primary): %s's relay published nothing for %.1fs at most, its consumer applied nothing for %.1fs; its backlog drained %.1fs after",
						row.Kind, row.From, row.To, row.NoPrimaryS, svc, st.RelayS, st.ConsumerS, st.DrainedS)
				}
			}
		}
		reach.Failovers = h.failovers.counts()
		least.Failovers, least.FailoverKinds = h.p.Failovers, failoverKinds
	}

	records, err := h.readKafka(ctx)
	if err != nil {
		return r, fmt.Errorf("reading what Kafka holds: %w", err)
	}
	db := judge.Databases{Orders: h.sys.Pools["orders"], Inventory: h.sys.Pools["inventory"], Provider: h.sys.Pools["provider"]}
	if len(final.Missing) > 0 {
		// A drain that ended with stages missing: each one's event followed
		// to Kafka and held to the group's offsets read when it ended.
		missing, err := judge.MissingEvents(ctx, db, final.Missing)
		if err != nil {
			return r, fmt.Errorf("following the missing stages: %w", err)
		}
		u := judge.ClassifyMissing(missing, records, h.lags)
		r.Lost, r.NotFinished = u.Lost(), u.NotFinished()
		r.Details[judge.NothingLost] += "; " + u.String()
	}
	if r.Windows, err = judge.MeasureWindows(ctx, db, filepath.Join(h.sys.Work, "provider.log"), log, hostile.ids(), records); err != nil {
		return r, fmt.Errorf("attributing the kills: %w", err)
	}
	v := judge.JudgeWindows(r.Windows, h.inbox, h.guard, h.keys)
	r.Invariants[judge.Attribution], r.Details[judge.Attribution] = v.OK, v.Detail
	r.CrashWindowDoubleApplied, r.CrashWindowFloor = v.CrashDoubled, v.CrashFloor
	r.EffectAttribution, r.EffectWindowDoubleCaptures, r.EffectWindowFloor = v.EffectOK, v.EffectDoubled, v.EffectFloor

	switch {
	case !h.inbox && !h.guard:
		// The second control sends no hostile message (run: newHostile):
		// its double-applies must come from the crash windows alone.
	default:
		handled := map[string]bool{}
		if hostile.sent.Load() {
			results, err := hostile.results(ctx)
			if err != nil {
				return r, err
			}
			r.Hostile = results
			for class, res := range results {
				handled[class] = res.Handled
			}
		}
		r.Invariants[judge.HostileCaught], r.Details[judge.HostileCaught] = judge.HostileVerdict(hostile.sent.Load(), handled)
	}

	// The consumers' continuity alarms: each break the hostile messages made
	// in a key's history, and nothing else (read from the inboxes).
	if h.inbox {
		seen, err := judge.MeasureBreaches(ctx, db)
		if err != nil {
			return r, err
		}
		var injected []judge.BreachInjected
		if hostile.sent.Load() {
			injected = hostile.injectedBreaks()
		}
		r.Invariants[judge.Continuity], r.Details[judge.Continuity] = judge.ContinuityVerdict(seen, injected)
	} else {
		r.Invariants[judge.Continuity], r.Details[judge.Continuity] = true, "not judged: the inbox is off (a control run), and with it the continuity check"
	}

	// Which layer caught the redeliveries. With both layers off there is
	// none left to judge, and the checker must find double-applies instead.
	if h.inbox || h.guard {
		if r.RefusedNotHostile, err = hostile.refusedOthers(ctx); err != nil {
			return r, err
		}
		r.Invariants[judge.Layers], r.Details[judge.Layers] = judge.LayersVerdict(h.inbox, r.DuplicatesSuppressed, r.RefusedNotHostile, r.Refused)
	}

	var probes []judge.ProbeStream
	for _, w := range h.probes {
		if err := w.resolve(ctx, h.sys.Pools[w.service]); err != nil {
			return r, err
		}
		probes = append(probes, judge.ProbeStream{Topic: probeTopic(w.service), Records: w.ours(records), Ledger: w.ledger})
	}
	if r.OrderedPerKey, err = judge.MeasureKeyOrder(ctx, db, records, probes); err != nil {
		return r, err
	}
	r.Invariants[judge.OrderedPerKey], r.Details[judge.OrderedPerKey] = judge.OrderedVerdict(r.OrderedPerKey)

	// What a failover can break and one node cannot: events applied whose
	// cause is gone, offsets committed past messages never applied.
	flows, err := h.readFlows(ctx)
	if err != nil {
		return r, err
	}
	if h.inbox {
		r.Invariants[judge.NoGhosts], r.Details[judge.NoGhosts] = judge.GhostsVerdict(flows, hostile.ids())
		r.Invariants[judge.CommittedApplied], r.Details[judge.CommittedApplied] = judge.CommittedVerdict(flows, records, hostile.ids())
	} else {
		// Both read what the inboxes recorded: with the inbox off (a
		// control run) no row records what was applied.
		const off = "not judged: the inbox is off (a control run), so no inbox row records what was applied"
		r.Invariants[judge.NoGhosts], r.Details[judge.NoGhosts] = true, off
		r.Invariants[judge.CommittedApplied], r.Details[judge.CommittedApplied] = true, off
	}

	// The run's reach last: a report cut short by an error shows no verdict
	// on it.
	r.Invariants[judge.FaultsBit], r.Details[judge.FaultsBit], r.TotalKills = judge.FaultsBitVerdict(reach, least)
	if names := judge.Unruled(r.Invariants); len(names) > 0 {
		return r, fmt.Errorf("invariants without a rule in chaos/judge's Rules: %v", names)
	}

	var failed []string
	for _, name := range sortedKeys(r.Invariants) {
		if !r.Invariants[name] {
			failed = append(failed, name)
		}
	}
	r.Passed, r.Failed = len(failed) == 0, strings.Join(failed, ",")
	return r, nil
}

func (r *Report) print() {
	fmt.Println()
	fmt.Printf("chaos run: profile %s, seed %d, inbox %s, relays %s, %.0fs\n", r.Profile, r.Seed, onOff(r.Inbox), r.Relay, r.DurationS)
	fmt.Printf("orders paid %d | kills %d (%d random) | restarts %d | postgres restarts %d | duplicates suppressed %d | refused by the domain guard %v (%d not hostile)\n",
		r.OrdersPaid, r.TotalKills, r.RandomKills, r.Restarts, r.PostgresRestarts, r.DuplicatesSuppressed, r.Refused, r.RefusedNotHostile)
	fmt.Printf("payments: %d captured once, %d declined once, %d orders with more than one attempt in the provider's ledger (effect keys %s)\n",
		r.Payments.Captured, r.Payments.Declined, r.Payments.CapturedTwice, onOff(r.EffectKeys))
	fmt.Printf("broker: %s\n", r.Broker)
	fmt.Printf("broker faults: %v (broker kills %d)\n", r.BrokerFaults, r.BrokerKills)
	if len(r.NetworkFaults) > 0 {
		fmt.Printf("network faults: %v\n", r.NetworkFaults)
	}
	fmt.Println()

	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WINDOW\tKILLED\tCONSUMER\tKILLS\t(HOSTILE)\tSEEN AGAIN\tAPPLIED 1×\tAPPLIED 2×+\tSUPPRESSED\tREFUSED\tCOPIES MET EFFECT\tWHAT HAPPENED")
	for _, w := range r.Windows {
		met := "-"
		if judge.CommittedBeforeKill(failpoint.Name(w.Window)) && w.Consumer != "" {
			met = fmt.Sprintf("%d (caught %d, 2× %d)", w.CopiesMetEffect, w.CopiesCaught, w.DoubleByWindow)
		}
		consumer := w.Consumer
		switch {
		case consumer == "" && w.Topic != "":
			consumer = "- (" + w.Topic + ")"
		case consumer == "":
			consumer = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", w.Window, w.Service, consumer, w.Kills, w.Hostile,
			w.Redelivered, w.AppliedOnce, w.AppliedTwice, w.Suppressed, w.Refused, met, w.Note)
	}
	tw.Flush()
	fmt.Println()

	if len(r.Hostile) > 0 {
		tw = tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOSTILE\tSENT\tQUARANTINED/DEAD\tAS\tREASON")
		for _, class := range sortedKeys(r.Hostile) {
			hr := r.Hostile[class]
			reason := hr.Reason
			if len(reason) > 70 {
				reason = reason[:70] + "…"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", class, hr.Sent, hr.QuarantinedOrDead, hr.ExpectedKind, reason)
		}
		tw.Flush()
		fmt.Println()
	}
	for _, name := range sortedKeys(r.Invariants) {
		status := "PASS"
		if !r.Invariants[name] {
			status = "FAIL"
		}
		fmt.Printf("  %s  %-19s %s\n", status, name, r.Details[name])
	}
	fmt.Println()
}
