package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/internal/check"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// Report is what a run writes with -report.
type Report struct {
	Seed                 uint64                   `json:"seed"`
	Profile              string                   `json:"profile"`
	Inbox                bool                     `json:"inbox"`
	Guard                bool                     `json:"guard"`
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
	Passed               bool                     `json:"passed"`
}

// WindowRow follows what happened to the subjects a window's kills were
// working on.
type WindowRow struct {
	Window      string `json:"window"`
	Fired       int    `json:"fired"`
	Kills       int    `json:"kills"`
	Redelivered int    `json:"redelivered"` // subjects the system came back to after the kill
	Suppressed  int    `json:"duplicates_suppressed"`
	Note        string `json:"note"`
}

// The invariants beyond internal/check's.
const (
	invFaultsBit = "faults-bit"     // kills, restarts and duplicates reached the profile's minimums
	invHostile   = "hostile-caught" // every hostile class quarantined or dead-lettered with a reason
	invLayers    = "layers"         // each layer caught what it must: the inbox every redelivery, or (inbox off) the guard
)

func (h *harness) report(ctx context.Context, final check.Report, hostile *hostile) (*Report, error) {
	fired, subjects := h.readFired()
	r := &Report{
		Seed: h.seed, Profile: h.p.Name, Inbox: h.inbox, Guard: h.guard, Refused: final.Refused,
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
		Lost:                 final.Unsettled + final.NotApplied,
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

	var short []string
	total := r.RandomKills
	for _, w := range failpoint.All {
		n := fired[w]
		r.Kills[string(w)] = n
		total += n
		if n < h.p.MinPerWindow && (h.inbox || w != failpoint.AfterInboxInsert) {
			short = append(short, fmt.Sprintf("%s fired %d < %d", w, n, h.p.MinPerWindow))
		}
		row, err := h.followWindow(ctx, w, subjects[w])
		if err != nil {
			return r, err
		}
		r.Windows = append(r.Windows, row)
	}
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
	if hostileOK {
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
	} else {
		r.Details[invHostile] = "hostile messages were never sent"
	}
	r.Invariants[invHostile] = hostileOK

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

	r.Passed = true
	for _, ok := range r.Invariants {
		r.Passed = r.Passed && ok
	}
	return r, nil
}

// followWindow looks up, after the run, what became of each subject a
// window's kills interrupted.
func (h *harness) followWindow(ctx context.Context, w failpoint.Name, subjects []string) (WindowRow, error) {
	row := WindowRow{Window: string(w), Fired: len(subjects), Kills: len(subjects)}
	orders := h.sys.Pools["orders"]
	for _, s := range subjects {
		switch w {
		case failpoint.AfterCommitBeforeResponse:
			// subject: an order id. The client retried; one OrderPaid?
			var n int
			if err := orders.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND partition_key = $2`,
				events.TopicOrders, s).Scan(&n); err != nil {
				return row, err
			}
			if n >= 1 {
				row.Redelivered++ // the retried payment found the order paid
			}
			if n == 1 {
				row.Suppressed++ // and published nothing more
			}
		default:
			// subject: a message id; for the relay windows, the first
			// message of the killed relay's batch.
			if err := h.followMessage(ctx, s, &row); err != nil {
				return row, err
			}
		}
	}
	row.Note = windowNotes[w]
	return row, nil
}

// followMessage finds message id in either consumer's inbox: whether it was
// processed after the kill and how many redeliveries were suppressed.
func (h *harness) followMessage(ctx context.Context, id string, row *WindowRow) error {
	for _, pool := range []*pgxpool.Pool{h.sys.Pools["orders"], h.sys.Pools["inventory"]} {
		var dups int
		err := pool.QueryRow(ctx, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, id).Scan(&dups)
		if err != nil {
			continue // not this consumer's message
		}
		row.Redelivered++
		row.Suppressed += dups
		return nil
	}
	return nil
}

var windowNotes = map[failpoint.Name]string{
	failpoint.BeforeBegin:               "nothing written; redelivered and applied once",
	failpoint.AfterInboxInsert:          "inbox row rolled back with the connection; redelivered and applied once",
	failpoint.AfterHandlerBeforeCommit:  "domain writes rolled back; redelivered and applied once",
	failpoint.AfterCommitBeforeAck:      "committed, offset not committed: redelivered and suppressed by the inbox",
	failpoint.AfterClaimBeforePublish:   "rows unlocked unpublished; the next relay published them",
	failpoint.AfterPublishBeforeMark:    "published but not marked: published again, the copy suppressed",
	failpoint.AfterCommitBeforeResponse: "paid, no answer: the client retried and got the paid order, no second OrderPaid",
}

func (r *Report) print() {
	fmt.Println()
	fmt.Printf("chaos run: profile %s, seed %d, inbox %s, %.0fs\n", r.Profile, r.Seed, onOff(r.Inbox), r.DurationS)
	fmt.Printf("orders paid %d | kills %d (%d random) | restarts %d | postgres restarts %d | duplicates suppressed %d | refused by the domain guard %v (%d not hostile)\n",
		r.OrdersPaid, r.TotalKills, r.RandomKills, r.Restarts, r.PostgresRestarts, r.DuplicatesSuppressed, r.Refused, r.RefusedNotHostile)
	fmt.Printf("broker: %s\n", r.Broker)
	fmt.Printf("broker faults: %v (broker kills %d)\n", r.BrokerFaults, r.BrokerKills)
	if len(r.NetworkFaults) > 0 {
		fmt.Printf("network faults: %v\n", r.NetworkFaults)
	}
	fmt.Println()

	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WINDOW\tFIRED\tKILLS\tREDELIVERED\tDUPLICATES SUPPRESSED\tWHAT HAPPENED")
	for _, w := range r.Windows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", w.Window, w.Fired, w.Kills, w.Redelivered, w.Suppressed, w.Note)
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
