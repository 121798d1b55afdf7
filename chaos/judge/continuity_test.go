package judge

import (
	"strings"
	"testing"
)

// TestContinuityVerdict: a clean run passes with no alarm; each injected
// break passes only with its own alarm (its consumer, message, kind and
// numbers); an alarm nobody injected (a lost event, a producer gone back
// in time, a false alarm) fails the run, and so does an injected break
// whose alarm never came.
func TestContinuityVerdict(t *testing.T) {
	t.Parallel()
	skip := BreachInjected{Class: "sequence_skipped", Consumer: "orders", Kind: "gap", Expected: 2, Got: 3, MessageID: "m-skip"}
	rewind := BreachInjected{Class: "sequence_rewound", Consumer: "orders", Kind: "rewind", Expected: 3, Got: 2, MessageID: "m-rewind"}
	alarm := func(b BreachInjected) BreachSeen {
		return BreachSeen{Consumer: b.Consumer, Kind: b.Kind, Topic: "inventory.events", Key: "k-" + b.Class, Expected: b.Expected, Got: b.Got, MessageID: b.MessageID}
	}
	lost := BreachSeen{Consumer: "inventory", Kind: "rewind", Topic: "orders.events", Key: "order-7", Expected: 3, Got: 2, MessageID: "m-ghost"}
	otherNumbers := alarm(skip)
	otherNumbers.Got = 4
	otherConsumer := alarm(skip)
	otherConsumer.Consumer = "inventory"

	for _, c := range []struct {
		name     string
		seen     []BreachSeen
		injected []BreachInjected
		ok       bool
		says     string
	}{
		{"Clean", nil, nil, true, "no alarm on the services' own histories"},
		{"EachInjectedWithItsAlarm", []BreachSeen{alarm(skip), alarm(rewind)}, []BreachInjected{skip, rewind}, true, "2 breaks injected, 2 alarms raised"},
		{"InjectedWithoutAlarm", []BreachSeen{alarm(skip)}, []BreachInjected{skip, rewind}, false, "1 injected breaks raised no alarm: sequence_rewound"},
		{"AlarmNobodyInjected", []BreachSeen{alarm(skip), lost}, []BreachInjected{skip}, false, `inventory saw a rewind on orders.events key "order-7"`},
		{"FalseAlarmInACleanRun", []BreachSeen{lost}, nil, false, "1 alarms on the services' own histories"},
		{"AlarmWithOtherNumbers", []BreachSeen{otherNumbers}, []BreachInjected{skip}, false, "raised no alarm"},
		{"AlarmOfAnotherConsumer", []BreachSeen{otherConsumer}, []BreachInjected{skip}, false, "raised no alarm"},
		{"OneAlarmForTwoBreaks", []BreachSeen{alarm(skip)}, []BreachInjected{skip, skip}, false, "raised no alarm"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, detail := ContinuityVerdict(c.seen, c.injected)
			if ok != c.ok || !strings.Contains(detail, c.says) {
				t.Errorf("ContinuityVerdict = %v, %q; want %v, saying %q", ok, detail, c.ok, c.says)
			}
		})
	}
}
