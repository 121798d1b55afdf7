package judge

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// AuditQuiet: the auditor running beside the run (services/auditor) raised
// no finding: none open at the end, none raised and resolved on the way.
const AuditQuiet = "audit-quiet"

// maxFindings bounds the findings AuditAfter reads: a run that raised
// more is not judged on some of them, so it is an error.
const maxFindings = 1_000_000

// AuditChecks are the auditor's checks, each of which must have caught up.
var AuditChecks = []string{"decisions", "orders", "refunds", "sales", "stock"}

// AuditAfter waits until every one of the auditor's checks (its database:
// pool) has caught up with everything that happened before now, grace
// being its grace period, and returns every finding it raised, open and
// resolved. A check's scan that caught up at or after now + grace examined
// every entity settled before now; and every finding still open must have
// been seen again since then (its recheck), so that an open finding is one
// the auditor still found at the end, not one it had not looked at again.
func AuditAfter(ctx context.Context, pool *pgxpool.Pool, grace time.Duration) ([]audit.Record, error) {
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT now() + make_interval(secs => $1)`, grace.Seconds()).Scan(&since); err != nil {
		return nil, fmt.Errorf("reading the auditor's clock: %w", err)
	}
	for {
		status, err := audit.ReadStatus(ctx, pool)
		if err != nil {
			return nil, err
		}
		caught := 0
		for _, s := range status {
			if slices.Contains(AuditChecks, s.Check) && !s.CaughtUpAt.Before(since) {
				caught++
			}
		}
		var unseen int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit_findings WHERE resolved_at IS NULL AND last_seen < $1`, since).Scan(&unseen); err != nil {
			return nil, fmt.Errorf("reading the auditor's open findings: %w", err)
		}
		if caught == len(AuditChecks) && unseen == 0 {
			found, err := audit.ListFindings(ctx, pool, audit.ListOptions{All: true, Limit: maxFindings})
			if err == nil && len(found) == maxFindings {
				err = fmt.Errorf("the auditor raised %d findings or more: more than a run is judged on", maxFindings)
			}
			return found, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the auditor did not catch up (%d of %d checks past %s, %d open findings not seen again since): %w",
				caught, len(AuditChecks), since.Format(time.RFC3339), unseen, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// AuditVerdict holds a run the auditor watched to raising nothing: every
// finding, open or resolved, is a breach the auditor saw on the live
// system (or a false alarm, as bad in a clean run).
func AuditVerdict(findings []audit.Record) Invariant {
	if len(findings) == 0 {
		return Invariant{AuditQuiet, true, fmt.Sprintf("the auditor's %d checks caught up with the run and raised nothing", len(AuditChecks))}
	}
	open := 0
	var examples []string
	for _, f := range findings {
		if f.Open() {
			open++
		}
		if len(examples) < maxExamples {
			state := "open"
			if !f.Open() {
				state = "resolved"
			}
			examples = append(examples, fmt.Sprintf("%s %s %s (%s): %s", f.Check, f.Kind, f.Entity, state, f.Detail))
		}
	}
	return Invariant{AuditQuiet, false, fmt.Sprintf("the auditor raised %d findings, %d still open: %s", len(findings), open, strings.Join(examples, "; "))}
}

// AuditAlarms: what the auditor raised in a run with kills and faults,
// judged as a person on call would. A finding of a lateness kind
// (LatenessKinds) says work was late, not wrong: it is an alarm only if
// the auditor still found it at the end (the drain gave up on it). Any
// other kind is a breach, always an alarm. A clean run raises none; a run
// with a breach in it must. How late the late work was is measured: the
// verdict names the latest, and how many were later than production's
// auditor would page at (AlarmLateness), which a chaos profile that
// overloads its machine on purpose may well reach.
const AuditAlarms = "audit-alarms"

// LatenessKinds are the auditor's kinds of finding that say an order's
// next step has not happened yet (services/auditor/checks.go): under
// kills, restarts and failovers a short grace period sees many, each
// resolved when the step comes.
var LatenessKinds = []string{"unanswered", "answer-unapplied", "capture-pending", "sale-missing", "refund-pending"}

// AlarmLateness is how late work may be before a person is paged for it
// in production: the auditor's default grace period, then the `for` of
// the AuditFindingOpen alert (deploy/prometheus/alerts.yml).
const AlarmLateness = audit.GraceDefault + time.Minute

// AuditAlarmsVerdict judges a run's findings, raised by an auditor whose
// grace period was grace: a lateness finding is as late as grace plus the
// time it stayed open. The findings about injected entities (a breach the
// harness injected on purpose) are no alarm of the run's: their own
// outcome judges them (WrongAnswerOutcome).
func AuditAlarmsVerdict(findings []audit.Record, grace time.Duration, injected map[string]bool) Invariant {
	var alarms []string
	late := map[string]int{}
	var latest time.Duration
	paged := 0
	expected := 0
	for _, f := range findings {
		name := fmt.Sprintf("%s %s %s", f.Check, f.Kind, f.Entity)
		switch {
		case injected[f.Entity]:
			expected++
		case !slices.Contains(LatenessKinds, f.Kind):
			alarms = append(alarms, fmt.Sprintf("%s (a breach): %s", name, f.Detail))
		case f.Open():
			alarms = append(alarms, fmt.Sprintf("%s still found at the end: %s", name, f.Detail))
		default:
			d := grace + f.ResolvedAt.Sub(f.FirstSeen)
			if d > AlarmLateness {
				paged++
			}
			late[f.Kind]++
			latest = max(latest, d)
		}
	}
	if len(alarms) > 0 {
		return Invariant{AuditAlarms, false, fmt.Sprintf("%d alarms among %d findings: %s", len(alarms), len(findings), strings.Join(alarms[:min(len(alarms), maxExamples)], "; "))}
	}
	if len(findings) == 0 {
		return Invariant{AuditAlarms, true, "the auditor raised nothing"}
	}
	return Invariant{AuditAlarms, true, fmt.Sprintf("no alarm: %d findings of late work, each resolved (by kind %v), no breach but the %d about injected breaches; the latest %s late, %d later than production pages at (%s)",
		len(findings)-expected, late, expected, latest.Round(time.Second), paged, AlarmLateness)}
}
