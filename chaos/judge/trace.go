package judge

import (
	"io"

	"github.com/outboxref/outbox-inbox/chaos/model/trace"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// TraceRow is what the trace check found, for the report.
type TraceRow struct {
	Variant    string         `json:"variant"`    // the model's -D flags the run is checked against
	Steps      int            `json:"steps"`      // failpoint log lines
	Subjects   int            `json:"subjects"`   // process × kind × subject projections
	Kills      map[string]int `json:"kills"`      // kills shown inside their window
	Violations []string       `json:"violations"` // the first steps the model does not allow
	Total      int            `json:"violations_total"`
}

// CheckTrace checks a run's failpoint log against the model: the protocol
// as built, or with the inbox's dedupe off (inbox false) for the control
// runs.
func CheckTrace(log io.Reader, inbox bool) (trace.Report, error) {
	variant := ""
	if !inbox {
		variant = "INBOX_OFF"
	}
	a, err := trace.Load(variant)
	if err != nil {
		return trace.Report{}, err
	}
	return a.Check(log)
}

// TraceRowOf keeps the report's part of rep: the first ten violations.
func TraceRowOf(rep trace.Report) TraceRow {
	row := TraceRow{Variant: rep.Variant, Steps: rep.Steps, Subjects: rep.Subjects, Kills: rep.Kills, Total: len(rep.Violations)}
	for i, v := range rep.Violations {
		if i == 10 {
			break
		}
		row.Violations = append(row.Violations, v.String())
	}
	return row
}

// ProvenKills counts, per window, the kills the trace shows inside it: a
// kill line whose process was elsewhere counts toward no window's floor.
func ProvenKills(rep trace.Report) map[failpoint.Name]int {
	n := map[failpoint.Name]int{}
	for w, k := range rep.Kills {
		n[failpoint.Name(w)] = k
	}
	return n
}
