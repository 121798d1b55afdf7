package judge

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outboxref/outbox-inbox/chaos/model/trace"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// The invariants a chaos run adds to Run's and CheckPayments', by name.
const (
	Attribution   = "attribution"     // per window, measured: the copies the crash windows made were caught, or (no layer) applied twice
	OrderedPerKey = "ordered-per-key" // per key in Kafka: one partition, first copies in commit order, none lost, none invented
	TraceInModel  = "trace-in-model"  // the failpoint trace is a behaviour of the protocol's model, every kill inside its window
	Layers        = "layers"          // each layer caught what it must: the inbox every redelivery, or (inbox off) the guard
	HostileCaught = "hostile-caught"  // every hostile class quarantined or dead-lettered with a reason
	FaultsBit     = "faults-bit"      // kills, restarts and duplicates reached the profile's minimums
)

// Rule is one invariant: what it says, where it is judged, and the
// controls that must see it fail. A checker no control can fail proves
// nothing, so every rule names at least one: a test that feeds the
// verdict the failure it rules out, or a control run (make chaos-ci) that
// breaks the system so the run must fail on it.
type Rule struct {
	Name     string
	Says     string
	JudgedBy string    // file and function, in chaos/judge
	Controls []Control // each must see the invariant fail
}

// Control is a test function in a file, or a chaos run in the Makefile,
// named by the flags that break the system for it.
type Control struct {
	File string // a _test.go file, or "Makefile"
	Name string // the test function, or the chaos run's flags
}

func (c Control) String() string {
	if c.File == "Makefile" {
		return "Makefile: chaos " + c.Name
	}
	return c.File + " " + c.Name
}

// Rules are every invariant a run is judged by: the demo's and the
// end-to-end tests' (Run, CheckPayments) and, with them, a chaos run's.
var Rules = []Rule{
	{ExactlyOnce, "each paid order: one OrderPaid, one application in inventory, one answer applied in orders",
		"chaos/judge/check.go exactlyOnce", []Control{
			{"Makefile", "-inbox=off -guard=off"},
			{"chaos/judge/check_test.go", "TestAdversarialRunsFail"},
			{"chaos/e2e/e2e_test.go", "TestCrashAfterCommitBeforeAckWithoutEitherLayer"}}},
	{EffectsHaveCauses, "every reservation, rejection, decision and OrderPaid belongs to a paid order; every answer orders applied is inventory's decision",
		"chaos/judge/causes.go effectsHaveCauses", []Control{{"chaos/judge/check_test.go", "TestAdversarialRunsFail"}}},
	{Quantities, "each reservation of an order holds, per SKU, exactly the order's lines",
		"chaos/judge/causes.go quantities", []Control{{"chaos/judge/check_test.go", "TestAdversarialRunsFail"}}},
	{StockConsistent, "per SKU: available = seeded − Σ reservations ≥ 0, reserved = Σ reservations − Σ fulfilments, sold = Σ fulfilments",
		"chaos/judge/check.go checkStock", []Control{{"chaos/judge/check_test.go", "TestAdversarialRunsFail"}}},
	{ClientAgrees, "the paid orders are, by id, the ones the client paid (or could not tell)",
		"chaos/judge/client.go clientAgrees", []Control{
			{"chaos/judge/check_test.go", "TestAdversarialRunsFail"},
			{"chaos/judge/check_test.go", "TestClientUnknownOutcomes"}}},
	{NothingLost, "every paid order settled, every captured order ended, both outboxes drained",
		"chaos/judge/check.go Run", []Control{{"chaos/judge/check_test.go", "TestAdversarialRunsFail"}}},
	{PaymentsOnce, "the provider's ledger holds one capture or one decline per reserved order, none for any other",
		"chaos/judge/payments.go CheckPayments", []Control{
			{"Makefile", "-effect-keys=off"},
			{"chaos/judge/payments_test.go", "TestPaymentsChecker"}}},
	{Attribution, "per crash window, measured: the copies its kills made came back and were caught (inbox, or guard), or with no layer were applied twice",
		"chaos/judge/attribution.go JudgeWindows, chaos/judge/attribution.go AttributionVerdict, chaos/judge/effects.go EffectVerdict", []Control{
			{"chaos/judge/attribution_test.go", "TestVerdictPerMode"},
			{"chaos/judge/attribution_test.go", "TestEffectVerdict"}}},
	{OrderedPerKey, "per key in Kafka: one partition, first copies in outbox commit order, none lost, none invented",
		"chaos/judge/ordered.go OrderedVerdict", []Control{
			{"Makefile", "-relay=parallel"},
			{"chaos/judge/ordered_test.go", "TestOrderedProbes"},
			{"chaos/judge/ordered_test.go", "TestOrderedEvents"}}},
	{TraceInModel, "the failpoint trace is a behaviour of the protocol's Promela model, process by process, every kill inside its window",
		"chaos/judge/trace.go CheckTrace, chaos/judge/invariants.go TraceVerdict", []Control{
			{"chaos/model/trace/trace_test.go", "TestMutationsAreRejected"},
			{"chaos/model/trace/trace_test.go", "TestSwapsWithinADeliveryAreRejected"},
			{"chaos/model/trace/trace_test.go", "TestTheVariantMatters"}}},
	{Layers, "with the inbox on, no redelivery of the system's own reaches the domain guard; with it off, the guard refuses them",
		"chaos/judge/invariants.go LayersVerdict", []Control{{"chaos/judge/invariants_test.go", "TestLayersVerdict"}}},
	{HostileCaught, "every hostile class sent was refused with its reason: quarantined or dead-lettered, refused by the guard or the broker, or answered 4xx",
		"chaos/judge/hostile.go HostileOutcome, chaos/judge/hostile.go BrokerRefusedOutcome, chaos/judge/hostile.go HTTPOutcome, chaos/judge/invariants.go HostileVerdict", []Control{
			{"chaos/judge/hostile_test.go", "TestHostileOutcome"},
			{"chaos/judge/invariants_test.go", "TestHostileVerdict"}}},
	{NoGhosts, "every event a consumer applied has its outbox row, the record of its cause, in its producer's database as it stands after the run",
		"chaos/judge/failover.go GhostsVerdict", []Control{{"chaos/judge/failover_test.go", "TestGhostsVerdict"}}},
	{CommittedApplied, "every record below its group's committed offset is in its consumer's inbox: nothing committed and never applied",
		"chaos/judge/failover.go CommittedVerdict", []Control{{"chaos/judge/failover_test.go", "TestCommittedVerdict"}}},
	{Continuity, "every key history the harness broke (a number skipped, a number given again) raised its consumer's alarm, and no other alarm was raised: no gap or rewind in the services' own histories",
		"chaos/judge/continuity.go ContinuityVerdict", []Control{
			{"Makefile", "-profile failover-async -orders"},
			{"chaos/judge/continuity_test.go", "TestContinuityVerdict"}}},
	{AuditQuiet, "the auditor running beside the system (services/auditor) caught up with the whole run and raised no finding, open or resolved",
		"chaos/judge/audit.go AuditVerdict", []Control{
			{"chaos/judge/audit_test.go", "TestAuditVerdict"},
			{"chaos/e2e/e2e_test.go", "TestCrashAfterCommitBeforeAckWithoutEitherLayer"}}},
	{AuditAlarms, "the auditor beside the run raised no alarm: no breach, and no late work still found at the end (how late it was is measured)",
		"chaos/judge/audit.go AuditAlarmsVerdict", []Control{
			{"chaos/judge/audit_test.go", "TestAuditAlarmsVerdict"},
			{"Makefile", "-inbox=off -guard=off"},
			{"Makefile", "-profile failover-async -orders"}}},
	{FaultsBit, "the run reached its profile's minimums: kills in every window, restarts, broker and network faults, duplicates suppressed",
		"chaos/judge/invariants.go FaultsBitVerdict", []Control{{"chaos/judge/invariants_test.go", "TestFaultsBitVerdict"}}},
}

// LayersVerdict judges which layer caught the redeliveries: with the inbox
// on, none may reach the guard (it refuses only hostile messages); with
// the inbox off, the guard must refuse some. notHostile is the guard's
// refusals of the system's own events, refused all of its refusals by
// service. With both layers off there is nothing to judge here.
func LayersVerdict(inbox bool, suppressed int64, notHostile int, refused map[string]int) (ok bool, detail string) {
	if inbox {
		return notHostile == 0, fmt.Sprintf("inbox: %d redeliveries suppressed; domain guard: %d of the system's own events refused (must be 0: the inbox stops them first), refusals by service %v",
			suppressed, notHostile, refused)
	}
	return notHostile > 0, fmt.Sprintf("inbox off; domain guard: %d of the system's own events refused (redeliveries that reached the domain; must be > 0), refusals by service %v",
		notHostile, refused)
}

// HostileVerdict judges the hostile classes sent: handled says, per class,
// whether every message of it was refused with its reason (HostileOutcome,
// BrokerRefusedOutcome, HTTPOutcome). Nothing sent, or nothing recorded,
// fails: the run proved nothing about hostile input.
func HostileVerdict(sent bool, handled map[string]bool) (ok bool, detail string) {
	switch {
	case !sent:
		return false, "hostile messages were never sent"
	case len(handled) == 0:
		return false, "hostile messages were sent, and no class's outcome was recorded"
	}
	var missed []string
	for _, class := range sortedKeys(handled) {
		if !handled[class] {
			missed = append(missed, class)
		}
	}
	detail = fmt.Sprintf("%d classes sent", len(handled))
	if len(missed) > 0 {
		detail += "; not caught: " + strings.Join(missed, ", ")
	}
	return len(missed) == 0, detail
}

// Reach is what a chaos run did to the system.
type Reach struct {
	Kills            map[failpoint.Name]int // kills shown inside their window (ProvenKills)
	Reached          []failpoint.Name       // the windows some service's code reaches in this mode
	RandomKills      int
	PostgresRestarts int
	Inbox            bool  // the inbox was on, so it must have suppressed a duplicate
	Suppressed       int64 // duplicates the inboxes suppressed

	Apache                                              bool // a real cluster: its faults count
	BrokerKills, LeaderChanges, Pauses, ClusterRestarts int
	Net                                                 bool // network faults were injected
	NetFaults, NetKinds                                 int
	Failovers                                           map[string]int // the replicated Postgres's failovers by kind; nil on one node
}

// Minimums are a profile's: what its run must reach to prove anything.
type Minimums struct {
	PerWindow, Kills, PostgresRestarts          int
	BrokerKills, Pauses, ClusterRestarts, Kinds int
	Failovers                                   int // of each kind
	FailoverKinds                               []string
}

// FaultsBitVerdict judges whether the faults bit: every window reached its
// kills, and every kind of fault its minimum. It returns the kills in all.
func FaultsBitVerdict(r Reach, least Minimums) (ok bool, detail string, total int) {
	var short []string
	total = r.RandomKills
	for _, w := range failpoint.All {
		n := r.Kills[w]
		total += n
		if n < least.PerWindow && slices.Contains(r.Reached, w) {
			short = append(short, fmt.Sprintf("%s fired %d < %d", w, n, least.PerWindow))
		}
	}
	if total < least.Kills {
		short = append(short, fmt.Sprintf("%d kills < %d", total, least.Kills))
	}
	if r.PostgresRestarts < least.PostgresRestarts {
		short = append(short, fmt.Sprintf("%d postgres restarts < %d", r.PostgresRestarts, least.PostgresRestarts))
	}
	if r.Apache {
		if r.BrokerKills < least.BrokerKills {
			short = append(short, fmt.Sprintf("%d broker kills < %d", r.BrokerKills, least.BrokerKills))
		}
		if r.LeaderChanges < 1 {
			short = append(short, "no leader change")
		}
		if r.Pauses < least.Pauses {
			short = append(short, fmt.Sprintf("%d zombie pauses < %d", r.Pauses, least.Pauses))
		}
		if r.ClusterRestarts < least.ClusterRestarts {
			short = append(short, fmt.Sprintf("%d full-cluster restarts < %d", r.ClusterRestarts, least.ClusterRestarts))
		}
	}
	if r.Net && r.NetKinds < least.Kinds {
		short = append(short, fmt.Sprintf("%d network fault kinds < %d", r.NetKinds, least.Kinds))
	}
	for _, kind := range least.FailoverKinds {
		if r.Failovers[kind] < least.Failovers {
			short = append(short, fmt.Sprintf("%d postgres failovers by %s < %d", r.Failovers[kind], kind, least.Failovers))
		}
	}
	if r.Inbox && r.Suppressed == 0 {
		short = append(short, "no duplicate was suppressed: the faults did not bite")
	}
	detail = fmt.Sprintf("%d kills (%d random), %d postgres restarts, %d duplicates suppressed",
		total, r.RandomKills, r.PostgresRestarts, r.Suppressed)
	if r.Apache {
		detail += fmt.Sprintf(", %d broker kills, %d leader changes, %d zombie pauses, %d full-cluster restarts",
			r.BrokerKills, r.LeaderChanges, r.Pauses, r.ClusterRestarts)
	}
	if r.Net {
		detail += fmt.Sprintf(", %d network faults of %d kinds", r.NetFaults, r.NetKinds)
	}
	if r.Failovers != nil {
		detail += fmt.Sprintf(", postgres failovers %v", r.Failovers)
	}
	if len(short) > 0 {
		detail += ": " + strings.Join(short, "; ")
	}
	return len(short) == 0, detail, total
}

// TraceVerdict judges a run's trace as CheckTrace found it: every step a
// behaviour of the model, every kill inside its window.
func TraceVerdict(rep trace.Report) (ok bool, detail string) { return rep.OK(), rep.Summary() }

// Unruled lists the names among invariants that no rule has: a verdict
// added without its rule, place and control.
func Unruled(invariants map[string]bool) []string {
	var out []string
	for _, name := range sortedKeys(invariants) {
		if !slices.ContainsFunc(Rules, func(r Rule) bool { return r.Name == name }) {
			out = append(out, name)
		}
	}
	return out
}
