package judge

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Continuity is the invariant on the consumers' continuity alarms (each
// inbox's inbox_continuity_breaches): every key history the harness broke
// raised its alarm, and nothing else raised one.
const Continuity = "continuity-alarms"

// BreachSeen is one continuity breach a consumer recorded.
type BreachSeen struct {
	Consumer, Kind, Topic, Key string
	Expected, Got              int64
	MessageID                  string
}

func (b BreachSeen) String() string {
	return fmt.Sprintf("%s saw a %s on %s key %q: number %d, %d expected (message %s)",
		b.Consumer, b.Kind, b.Topic, b.Key, b.Got, b.Expected, b.MessageID)
}

// BreachInjected is a break the harness made in a key's numbered history:
// the message that shows it, and the breach its consumer must record.
type BreachInjected struct {
	Class          string
	Consumer, Kind string
	Expected, Got  int64
	MessageID      string
}

// MeasureBreaches reads every continuity breach both consumers recorded,
// with the judge's own SQL.
func MeasureBreaches(ctx context.Context, db Databases) ([]BreachSeen, error) {
	var out []BreachSeen
	for service, pool := range map[string]querier{"orders": db.Orders, "inventory": db.Inventory} {
		rows, err := pool.Query(ctx, `SELECT consumer, kind, topic, partition_key, expected, got, message_id
			FROM inbox_continuity_breaches ORDER BY id`)
		if err != nil {
			return nil, fmt.Errorf("reading %s's continuity breaches: %w", service, err)
		}
		seen, err := pgx.CollectRows(rows, pgx.RowToStructByPos[BreachSeen])
		if err != nil {
			return nil, fmt.Errorf("reading %s's continuity breaches: %w", service, err)
		}
		out = append(out, seen...)
	}
	return out, nil
}

// ContinuityVerdict judges Continuity: each injected break must have its
// breach, recorded by its consumer on its message with the kind and
// numbers it must have; and every breach recorded must be one injected: a
// gap or a rewind in the services' own histories (a lost event, a producer
// gone back in time) fails the run, and so does a false alarm.
func ContinuityVerdict(seen []BreachSeen, injected []BreachInjected) (ok bool, detail string) {
	matched := make([]bool, len(seen))
	var missing []string
	for _, want := range injected {
		found := false
		for i, b := range seen {
			if !matched[i] && b.MessageID == want.MessageID && b.Consumer == want.Consumer && b.Kind == want.Kind &&
				b.Expected == want.Expected && b.Got == want.Got {
				matched[i], found = true, true
				break
			}
		}
		if !found {
			missing = append(missing, fmt.Sprintf("%s: %s's %s alarm (number %d, %d expected) on %s", want.Class, want.Consumer, want.Kind,
				want.Got, want.Expected, want.MessageID))
		}
	}
	var unexplained []string
	for i, b := range seen {
		if !matched[i] {
			unexplained = append(unexplained, b.String())
		}
	}
	sort.Strings(unexplained)
	var d strings.Builder
	fmt.Fprintf(&d, "%d breaks injected, %d alarms raised by them", len(injected), len(injected)-len(missing))
	if len(missing) > 0 {
		fmt.Fprintf(&d, "; %d injected breaks raised no alarm: %s", len(missing), quote(missing))
	}
	if len(unexplained) > 0 {
		fmt.Fprintf(&d, "; %d alarms on the services' own histories (lost events, or a producer gone back in time): %s",
			len(unexplained), quote(unexplained))
	} else {
		d.WriteString("; no alarm on the services' own histories")
	}
	return len(missing) == 0 && len(unexplained) == 0, d.String()
}

// quote is the first maxExamples of s, and how many more.
func quote(s []string) string {
	out := strings.Join(s[:min(maxExamples, len(s))], "; ")
	if len(s) > maxExamples {
		out += fmt.Sprintf("; and %d more", len(s)-maxExamples)
	}
	return out
}
