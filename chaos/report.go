package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/testbed/judge"
)

// Report is what a run writes with -report.
type Report struct {
	Seed                 uint64                   `json:"seed"`
	Profile              string                   `json:"profile"`
	Inbox                bool                     `json:"inbox"`
	Guard                bool                     `json:"guard"`
	Relay                string                   `json:"relay"` // the services' relays: one leader, sharded, or parallel (the ordering control)
	DurationS            float64                  `json:"duration_s"`
	OrdersPaid           int                      `json:"orders_paid"`
	Kills                map[string]int           `json:"kills"` // crash window → SIGKILLs it caused
	RandomKills          int                      `json:"random_kills"`
	TotalKills           int                      `json:"total_kills"`
	Restarts             int                      `json:"restarts"`
	PostgresRestarts     int                      `json:"postgres_restarts"`
	Broker               string                   `json:"broker"`        // implementation and version
	BrokerFaults         map[string]int           `json:"broker_faults"` // by class (and leader_changes they caused)
	BrokerKills          int                      `json:"broker_kills"`
	NetworkFaults        map[string]int           `json:"network_faults"`        // "<postgres|kafka>_<kind>" → times applied
	DuplicatesSuppressed int64                    `json:"duplicates_suppressed"` // caught by the inbox, the first layer
	Refused              map[string]int           `json:"refused"`               // per service, caught by the domain guard, the second layer
	RefusedNotHostile    int                      `json:"refused_not_hostile"`   // of those, refusals of the system's own messages: redeliveries
	DoubleApplied        int                      `json:"double_applied"`
	Lost                 int                      `json:"lost"`
	Invariants           map[string]bool          `json:"invariants"`
	Details              map[string]string        `json:"details"`
	Hostile              map[string]HostileResult `json:"hostile"`
	Windows              []WindowRow              `json:"windows"`
	Trace                TraceRow                 `json:"trace"` // the failpoint trace checked against the model (modeltrace.go)
	// The crash windows' own double-applies (hostile messages excluded) and
	// the floor they must reach in the second control run: every copy that
	// met an effect committed before its kill (attribution.go).
	CrashWindowDoubleApplied int `json:"crash_window_double_applied"`
	CrashWindowFloor         int `json:"crash_window_floor"`
	// The same for the effect windows: captures after-effect-before-record
	// kills made twice (only without keys), and the floor for the effect
	// control run: every such capture that was called again (effects.go).
	EffectKeys                 bool        `json:"effect_keys"`
	EffectAttribution          bool        `json:"effect_attribution"` // the effect windows' part of the attribution held
	EffectWindowDoubleCaptures int         `json:"effect_window_double_captures"`
	EffectWindowFloor          int         `json:"effect_window_floor"`
	Payments                   PaymentsRow `json:"payments"`
	// What ordered-per-key found, per topic: the probe streams' and the
	// events' (ordered.go).
	OrderedPerKey []TopicOrder `json:"ordered_per_key"`
	Passed        bool         `json:"passed"`
	// Failed names the invariants that failed, comma-separated ("" when
	// it passed), for a control run to show it failed for its reason.
	Failed string `json:"failed"`
}

// PaymentsRow is what the provider's ledger holds (judge.CheckPayments).
type PaymentsRow struct {
	Captured      int `json:"captured"`       // reserved orders captured once
	Declined      int `json:"declined"`       // reserved orders declined once
	CapturedTwice int `json:"captured_twice"` // orders with more than one attempt
}

// WindowRow is what one crash window's kills in one service did to the
// subjects they interrupted (attribution.go). Every count is measured.
type WindowRow struct {
	Window      string `json:"window"`
	Service     string `json:"service"`         // the killed service ("hostile": the subject was a hostile message)
	Consumer    string `json:"consumer"`        // the service that consumes the subject ("" for dead letters and probe messages)
	Topic       string `json:"topic,omitempty"` // where a subject nobody consumes went: <service>.dlq or <service>.probe
	Kills       int    `json:"kills"`
	Hostile     int    `json:"hostile"`     // of those, on hostile messages: left out of everything below
	Redelivered int    `json:"redelivered"` // subjects seen again after the kill
	AppliedOnce int    `json:"applied_once"`
	// AppliedTwice: subjects applied more than once by their consumer,
	// whatever the cause.
	AppliedTwice int `json:"applied_twice"`
	Suppressed   int `json:"duplicates_suppressed"` // copies of the subjects the inbox suppressed
	Refused      int `json:"refused"`               // copies the domain guard refused
	// Where the effect was committed before the kill: the subjects that came
	// back and so met it, how many of those a layer caught, and how many
	// were applied twice.
	CopiesMetEffect int    `json:"copies_met_effect"`
	CopiesCaught    int    `json:"copies_caught"`
	DoubleByWindow  int    `json:"double_by_window"`
	Note            string `json:"note"`
}

// The invariants beyond testbed/judge's.
const (
	invFaultsBit = "faults-bit"      // kills, restarts and duplicates reached the profile's minimums
	invHostile   = "hostile-caught"  // every hostile class quarantined or dead-lettered with a reason
	invLayers    = "layers"          // each layer caught what it must: the inbox every redelivery, or (inbox off) the guard
	invAttrib    = "attribution"     // per window, measured: the copies the crash windows made were caught, or (no layer) applied twice
	invOrdered   = "ordered-per-key" // per key in Kafka: one partition, first copies in commit order, none lost, none invented (ordered.go)
)

func (h *harness) report(ctx context.Context, final judge.Report, hostile *hostile) (*Report, error) {
	log, err := h.readLog(true)
	if err != nil {
		return nil, fmt.Errorf("reading the failpoint log: %w", err)
	}
	h.countFired(log)             // the per-service counts arming balances on
	traced, err := h.checkTrace() // modeltrace.go
	if err != nil {
		return nil, fmt.Errorf("checking the trace against the model: %w", err)
	}
	fired := provenKills(traced)
	r := &Report{
		Seed: h.seed, Profile: h.p.Name, Inbox: h.inbox, Guard: h.guard, EffectKeys: h.keys, Relay: h.p.relay(), Refused: final.Refused,
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
		Hostile:              map[string]HostileResult{},
	}
	// The client's paid orders are compared with the database's by id in
	// check (client-agrees), not by count here: a count passes a run that
	// lost one payment and invented another.
	for _, inv := range final.Invariants {
		r.Invariants[inv.Name] = inv.OK
		r.Details[inv.Name] = inv.Detail
	}
	r.Trace = traceRow(traced)
	r.Invariants[invModel] = traced.OK()
	r.Details[invModel] = traced.Summary()

	var short []string
	total := r.RandomKills
	for _, w := range failpoint.All {
		n := fired[w]
		r.Kills[string(w)] = n
		total += n
		if n < h.p.MinPerWindow && reached(w, h.inbox) {
			short = append(short, fmt.Sprintf("%s fired %d < %d", w, n, h.p.MinPerWindow))
		}
	}
	records, err := h.readKafka(ctx)
	if err != nil {
		return r, fmt.Errorf("reading what Kafka holds: %w", err)
	}
	facts, err := h.gatherFacts(ctx, log, hostile.ids(), records)
	if err != nil {
		return r, fmt.Errorf("attributing the kills: %w", err)
	}
	r.Windows = attribute(log, facts)
	var attribOK bool
	attribOK, r.Details[invAttrib], r.CrashWindowDoubleApplied, r.CrashWindowFloor = attributionVerdict(r.Windows, h.inbox, h.guard)
	effectsOK, effectDetail, doubleCaptures, effectFloor := effectVerdict(r.Windows, h.keys) // effects.go
	r.Details[invAttrib] += "; " + effectDetail
	r.EffectWindowDoubleCaptures, r.EffectWindowFloor, r.EffectAttribution = doubleCaptures, effectFloor, effectsOK
	r.Invariants[invAttrib] = attribOK && effectsOK
	r.Payments = PaymentsRow{Captured: h.payments.Captured, Declined: h.payments.Declined, CapturedTwice: h.payments.CapturedTwice}
	r.TotalKills = total
	if total < h.p.MinKills {
		short = append(short, fmt.Sprintf("%d kills < %d", total, h.p.MinKills))
	}
	if r.PostgresRestarts < h.p.PGRestarts {
		short = append(short, fmt.Sprintf("%d postgres restarts < %d", r.PostgresRestarts, h.p.PGRestarts))
	}
	if h.apache != nil {
		r.BrokerKills = h.apache.kills()
		bf := r.BrokerFaults
		if r.BrokerKills < h.p.MinBrokerKills {
			short = append(short, fmt.Sprintf("%d broker kills < %d", r.BrokerKills, h.p.MinBrokerKills))
		}
		if bf[countLeaderChanges] < 1 {
			short = append(short, "no leader change")
		}
		if bf[faultBrokerPaused] < h.p.MinPauses {
			short = append(short, fmt.Sprintf("%d zombie pauses < %d", bf[faultBrokerPaused], h.p.MinPauses))
		}
		if bf[faultClusterRestarted] < h.p.ClusterRestarts {
			short = append(short, fmt.Sprintf("%d full-cluster restarts < %d", bf[faultClusterRestarted], h.p.ClusterRestarts))
		}
	}
	if h.net != nil {
		r.NetworkFaults = h.net.counts()
		if k := h.net.kinds(); k < h.p.MinNetKinds {
			short = append(short, fmt.Sprintf("%d network fault kinds < %d", k, h.p.MinNetKinds))
		}
	}
	if h.inbox && r.DuplicatesSuppressed == 0 {
		short = append(short, "no duplicate was suppressed: the faults did not bite")
	}
	r.Invariants[invFaultsBit] = len(short) == 0
	r.Details[invFaultsBit] = fmt.Sprintf("%d kills (%d random), %d postgres restarts, %d duplicates suppressed",
		total, r.RandomKills, r.PostgresRestarts, r.DuplicatesSuppressed)
	if h.apache != nil {
		r.Details[invFaultsBit] += fmt.Sprintf(", %d broker kills, %d leader changes, %d zombie pauses, %d full-cluster restarts",
			r.BrokerKills, r.BrokerFaults[countLeaderChanges], r.BrokerFaults[faultBrokerPaused], r.BrokerFaults[faultClusterRestarted])
	}
	if h.net != nil {
		r.Details[invFaultsBit] += fmt.Sprintf(", %d network faults of %d kinds", h.net.total(), h.net.kinds())
	}
	if len(short) > 0 {
		r.Details[invFaultsBit] += ": " + strings.Join(short, "; ")
	}

	hostileOK := hostile.sent.Load()
	switch {
	case !h.inbox && !h.guard:
		// The second control sends no hostile message (run: newHostile):
		// its double-applies must come from the crash windows alone.
	case hostileOK:
		results, err := hostile.results(ctx)
		if err != nil {
			return r, err
		}
		r.Hostile = results
		var missed []string
		for _, class := range sortedKeys(results) {
			if !results[class].Handled {
				hostileOK = false
				missed = append(missed, class)
			}
		}
		r.Details[invHostile] = fmt.Sprintf("%d classes sent", len(results))
		if len(missed) > 0 {
			r.Details[invHostile] += "; not caught: " + strings.Join(missed, ", ")
		}
		r.Invariants[invHostile] = hostileOK
	default:
		r.Details[invHostile] = "hostile messages were never sent"
		r.Invariants[invHostile] = false
	}

	// Which layer caught the redeliveries: with the inbox on, none may
	// reach the guard (it refuses only hostile messages); with the inbox
	// off, the guard must refuse them. With both off there is no layer left
	// to judge, and the checker must find double-applies instead.
	if h.inbox || h.guard {
		n, err := hostile.refusedOthers(ctx)
		if err != nil {
			return r, err
		}
		r.RefusedNotHostile = n
		if h.inbox {
			r.Invariants[invLayers] = n == 0
			r.Details[invLayers] = fmt.Sprintf("inbox: %d redeliveries suppressed; domain guard: %d of the system's own events refused (must be 0: the inbox stops them first), refusals by service %v",
				r.DuplicatesSuppressed, n, r.Refused)
		} else {
			r.Invariants[invLayers] = n > 0
			r.Details[invLayers] = fmt.Sprintf("inbox off; domain guard: %d of the system's own events refused (redeliveries that reached the domain; must be > 0), refusals by service %v",
				n, r.Refused)
		}
	}

	if r.OrderedPerKey, err = h.orderedPerKey(ctx, records); err != nil {
		return r, err
	}
	r.Invariants[invOrdered], r.Details[invOrdered] = orderedVerdict(r.OrderedPerKey)

	var failed []string
	for _, name := range sortedKeys(r.Invariants) {
		if !r.Invariants[name] {
			failed = append(failed, name)
		}
	}
	r.Passed, r.Failed = len(failed) == 0, strings.Join(failed, ",")
	return r, nil
}

var windowNotes = map[failpoint.Name]string{
	failpoint.BeforeBegin:               "nothing written; redelivered, applied once",
	failpoint.AfterInboxInsert:          "inbox row rolled back with the connection; redelivered, applied once",
	failpoint.AfterHandlerBeforeCommit:  "domain writes rolled back; redelivered, applied once",
	failpoint.AfterCommitBeforeAck:      "committed, offset not: the copy meets the effect",
	failpoint.AfterClaimBeforePublish:   "claimed, not sent: the next relay sent it (copies in Kafka ≥ 1)",
	failpoint.AfterPublishBeforeMark:    "sent, not marked: sent again (copies in Kafka ≥ 2), the copy meets the effect",
	failpoint.AfterCommitBeforeResponse: "paid, no answer: the client retried, got the paid order; OrderPaid rows = applied",
	failpoint.BeforeEffect:              "capture intent committed, not called: called again after the lease; ledger attempts = applied",
	failpoint.AfterEffectBeforeRecord:   "captured, not recorded: called again with its key, the provider replays (suppressed = replays)",
}

// unconsumedNotes are the relay windows' notes for messages nobody
// consumes (dead letters, probe messages): their copies in Kafka are all
// there is to measure.
var unconsumedNotes = map[failpoint.Name]string{
	failpoint.AfterClaimBeforePublish: "claimed, not sent: the next relay sent it (copies in Kafka ≥ 1); nobody consumes it",
	failpoint.AfterPublishBeforeMark:  "sent, not marked: sent again (copies in Kafka ≥ 2); nobody consumes it",
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
		if committedBeforeKill(failpoint.Name(w.Window)) && w.Consumer != "" {
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
