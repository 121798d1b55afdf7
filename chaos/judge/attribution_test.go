package judge

import (
	"strings"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// logOf builds a failpoint log from lines "kill WINDOW SUBJECT" and "hit
// WINDOW SUBJECT", in order, as the services write it.
func logOf(lines ...string) Log {
	var b strings.Builder
	for i, l := range lines {
		f := strings.Fields(l)
		switch f[0] {
		case "kill":
			b.WriteString("failpoint " + f[1] + " fired: SIGKILL pid 100" + string(rune('0'+i%10)) + " subject " + f[2] + "\n")
		case "hit":
			b.WriteString("failpoint " + f[1] + " hit: pid 200" + string(rune('0'+i%10)) + " subject " + f[2] + "\n")
		}
		b.WriteString("unrelated service output\n")
	}
	l, err := ParseLog(strings.NewReader(b.String()), true)
	if err != nil {
		panic(err)
	}
	return l
}

const (
	ack     = string(failpoint.AfterCommitBeforeAck)
	begin   = string(failpoint.BeforeBegin)
	claim   = string(failpoint.AfterClaimBeforePublish)
	mark    = string(failpoint.AfterPublishBeforeMark)
	respond = string(failpoint.AfterCommitBeforeResponse)
)

// paid and answer are the facts of an OrderPaid (orders → inventory) and of
// an InventoryReserved (inventory → orders).
func paid(f subjectFacts) subjectFacts {
	f.producer, f.consumer = "orders", "inventory"
	return f
}

func answer(f subjectFacts) subjectFacts {
	f.producer, f.consumer = "inventory", "orders"
	return f
}

func row(t *testing.T, rows []WindowRow, window, service string) WindowRow {
	t.Helper()
	for _, r := range rows {
		if r.Window == window && r.Service == service {
			return r
		}
	}
	t.Fatalf("no row %s/%s in %+v", window, service, rows)
	return WindowRow{}
}

// TestRedeliveryIsMeasured: a subject counts as seen again only when a
// trace line of it follows its kill. The old report counted a subject as
// redelivered whenever its inbox row existed, which is always true after
// after-commit-before-ack: m-2's only trace line is the killed delivery's
// own, before the kill, and it must not count.
func TestRedeliveryIsMeasured(t *testing.T) {
	l := logOf(
		"hit "+begin+" m-1", "kill "+ack+" m-1", "hit "+begin+" m-1",
		"hit "+begin+" m-2", "kill "+ack+" m-2",
		"kill "+claim+" m-3", "hit "+begin+" m-3", "kill "+claim+" m-4", "kill "+claim+" m-7",
		"hit "+begin+" m-5", "kill "+mark+" m-5", "hit "+begin+" m-5", "kill "+mark+" m-6", "hit "+begin+" m-6",
		"kill "+mark+" m-8", "hit "+begin+" m-8",
		"kill "+respond+" o-1", "hit "+respond+" o-1", "hit "+respond+" o-2", "kill "+respond+" o-2",
	)
	facts := map[string]subjectFacts{
		"m-1": paid(subjectFacts{applied: 1, dups: 1}),
		"m-2": paid(subjectFacts{applied: 1}),
		"m-3": paid(subjectFacts{applied: 1, copies: 1}),
		"m-4": paid(subjectFacts{copies: 0}),
		"m-5": paid(subjectFacts{applied: 1, copies: 2, dups: 1}),
		"m-6": paid(subjectFacts{applied: 1, copies: 1}),
		// In Kafka, but not (again) handed to the consumer when the run
		// stopped: nothing came back to it.
		"m-7": paid(subjectFacts{copies: 1}),
		"m-8": paid(subjectFacts{applied: 1, copies: 2}),
		"o-1": {producer: "orders", consumer: "orders", applied: 1},
		"o-2": {producer: "orders", consumer: "orders", applied: 1},
	}
	rows := attribute(l, facts)
	for _, c := range []struct {
		window, service string
		kills, again    int
	}{
		{ack, "inventory", 2, 1},
		{claim, "orders", 3, 1},
		{mark, "orders", 3, 1},
		{respond, "orders", 2, 1},
	} {
		r := row(t, rows, c.window, c.service)
		if r.Kills != c.kills || r.Redelivered != c.again {
			t.Errorf("%s/%s: %d kills, %d seen again; want %d, %d", c.window, c.service, r.Kills, r.Redelivered, c.kills, c.again)
		}
	}
	if r := row(t, rows, mark, "orders"); r.CopiesMetEffect != 1 || r.CopiesCaught != 1 {
		t.Errorf("mark: %d copies met the effect, %d caught; want 1, 1", r.CopiesMetEffect, r.CopiesCaught)
	}
}

// TestVerdictPerMode: each mode's bar, and runs crafted to pass the old
// bars that the new one must fail.
func TestVerdictPerMode(t *testing.T) {
	seen := func(ids ...string) []string {
		var lines []string
		for _, id := range ids {
			lines = append(lines, "kill "+ack+" "+id, "hit "+begin+" "+id)
		}
		return lines
	}
	// m-* are OrderPaid (inventory consumes), a-* answers (orders consumes),
	// h-1 a hostile message.
	both := seen("m-1", "a-1")
	cases := []struct {
		name         string
		inbox, guard bool
		lines        []string
		facts        map[string]subjectFacts
		ok           bool
		want         string // in the detail
		doubled      int
		floor        int
	}{
		{name: "main run: both consumers' copies suppressed", inbox: true, guard: true, lines: both, ok: true, floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, dups: 1}), "a-1": answer(subjectFacts{applied: 1, dups: 1})}},
		// The old bar (duplicates suppressed > 0 in all) is met by the
		// 50-delivery burst alone; here no crash-window copy was.
		{name: "main run: a consumer's copy not suppressed", inbox: true, guard: true, lines: both, want: "no copy suppressed", floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, dups: 1}), "a-1": answer(subjectFacts{applied: 1})}},
		{name: "main run: orders' consumer never killed at the window", inbox: true, guard: true, lines: seen("m-1"),
			want: "no kill of orders's own messages", floor: 1,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, dups: 1})}},
		{name: "main run: killed but never seen again", inbox: true, guard: true,
			lines: []string{"hit " + begin + " m-1", "kill " + ack + " m-1", "kill " + ack + " a-1", "hit " + begin + " a-1"},
			want:  ack + "/inventory: 1 kills, no subject seen again", floor: 1,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, dups: 1}), "a-1": answer(subjectFacts{applied: 1, dups: 1})}},
		{name: "first control: the guard refuses each copy", guard: true, lines: both, ok: true, floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, refused: 1}), "a-1": answer(subjectFacts{applied: 1, refused: 2})}},
		{name: "first control: a copy applied twice", guard: true, lines: both, want: "1 copies met a committed effect, 0 refused by the guard, 1 applied twice", doubled: 1, floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1, refused: 1}), "a-1": answer(subjectFacts{applied: 2})}},
		{name: "second control: every copy applied twice", lines: both, ok: true, doubled: 2, floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 2}), "a-1": answer(subjectFacts{applied: 2})}},
		// The old bar (double_applied ≥ 1) is met by one double-apply from
		// anywhere, a hostile message among them; here the crash windows'
		// copies were applied once: something unseen stopped them.
		{name: "second control: a copy applied once", lines: append(both, "kill "+ack+" h-1", "hit "+begin+" h-1"),
			want: "1 copies met a committed effect with no layer to stop them, only 0 applied twice", doubled: 1, floor: 2,
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 2}), "a-1": answer(subjectFacts{applied: 1}), "h-1": {hostile: true, applied: 2}}},
		{name: "second control: no copy came back", lines: []string{"kill " + ack + " m-1", "kill " + ack + " a-1"},
			want:  "no copy met a committed effect",
			facts: map[string]subjectFacts{"m-1": paid(subjectFacts{applied: 1}), "a-1": answer(subjectFacts{applied: 1})}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := attribute(logOf(c.lines...), c.facts)
			ok, detail, doubled, floor := AttributionVerdict(rows, c.inbox, c.guard)
			if ok != c.ok || !strings.Contains(detail, c.want) {
				t.Errorf("verdict %v, %q; want %v with %q", ok, detail, c.ok, c.want)
			}
			if doubled != c.doubled || floor != c.floor {
				t.Errorf("doubled %d, floor %d; want %d, %d", doubled, floor, c.doubled, c.floor)
			}
		})
	}
}

// TestHostileSubjectsAreLeftOut: a kill on a hostile message is counted
// apart, and its double-apply is not the window's.
// TestSeenAgainByAnotherProcess: a trace line the killed process wrote
// (its own concurrent work on the subject, flushed after the kill line) is
// not a redelivery; a subject holding a space or a newline stays one field.
func TestSeenAgainByAnotherProcess(t *testing.T) {
	in := "failpoint before-begin hit: pid 7 subject m-1\n" +
		"failpoint after-commit-before-ack fired: SIGKILL pid 7 subject m-1\n" +
		"failpoint before-begin hit: pid 7 subject m-1\n"
	l, err := ParseLog(strings.NewReader(in), true)
	if err != nil {
		t.Fatal(err)
	}
	if l.seenAfter(failpoint.BeforeBegin, l.Kills[0]) {
		t.Fatal("the killed process's own line counted as the message seen again")
	}
	l, _ = ParseLog(strings.NewReader(in+"failpoint before-begin hit: pid 8 subject m-1\n"), true)
	if !l.seenAfter(failpoint.BeforeBegin, l.Kills[0]) {
		t.Fatal("another process's delivery after the kill was not seen")
	}
}

func TestHostileSubjectsAreLeftOut(t *testing.T) {
	rows := attribute(logOf("kill "+ack+" h-1", "hit "+begin+" h-1", "kill "+ack+" nobody-wrote-this"),
		map[string]subjectFacts{"h-1": {hostile: true, applied: 2}})
	r := row(t, rows, ack, "hostile")
	if r.Kills != 2 || r.Hostile != 2 || r.Redelivered != 0 || r.AppliedTwice != 0 {
		t.Fatalf("hostile row %+v: want 2 kills, both hostile, nothing else counted", r)
	}
}

// TestEffectVerdict: with keys, a capture made twice or a repeated call
// the provider did not replay fails; without keys, a repeated call that
// did not capture again, or no repeated call at all, fails the control.
func TestEffectVerdict(t *testing.T) {
	before := WindowRow{Window: string(failpoint.BeforeEffect), Service: "orders", Consumer: "provider", Kills: 3, Redelivered: 3, AppliedOnce: 3}
	after := func(mod func(*WindowRow)) []WindowRow {
		r := WindowRow{Window: string(failpoint.AfterEffectBeforeRecord), Service: "orders", Consumer: "provider",
			Kills: 4, Redelivered: 4, AppliedOnce: 4, Suppressed: 4, CopiesMetEffect: 4, CopiesCaught: 4}
		mod(&r)
		return []WindowRow{before, r}
	}
	for _, tc := range []struct {
		name string
		rows []WindowRow
		keys bool
		ok   bool
	}{
		{"keys: every repeat replayed", after(func(*WindowRow) {}), true, true},
		{"keys: a capture made twice", after(func(r *WindowRow) { r.AppliedOnce, r.AppliedTwice = 3, 1 }), true, false},
		{"keys: a repeat not replayed", after(func(r *WindowRow) { r.CopiesCaught = 3 }), true, false},
		{"keys: a kill never called again", after(func(r *WindowRow) { r.Redelivered = 0 }), true, false},
		{"no keys: every repeat captured twice", after(func(r *WindowRow) {
			r.AppliedOnce, r.AppliedTwice, r.CopiesCaught, r.DoubleByWindow = 0, 4, 0, 4
		}), false, true},
		{"no keys: a repeat captured once", after(func(r *WindowRow) {
			r.AppliedOnce, r.AppliedTwice, r.CopiesCaught, r.DoubleByWindow = 1, 3, 0, 3
		}), false, false},
		{"no keys: nothing called again", after(func(r *WindowRow) { r.Redelivered, r.CopiesMetEffect, r.Kills = 0, 0, 0 }), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, detail, _, _ := EffectVerdict(tc.rows, tc.keys)
			if ok != tc.ok {
				t.Fatalf("effectVerdict = %v, want %v: %s", ok, tc.ok, detail)
			}
		})
	}
}

// TestProbeSubjectsHaveRowsOfTheirOwn: a relay window's kill on a message
// nobody consumes (a probe message, a dead letter) is judged by its copies
// in Kafka alone, in a row of its topic, apart from the events' rows.
func TestProbeSubjectsHaveRowsOfTheirOwn(t *testing.T) {
	l := logOf("kill "+mark+" p-1", "kill "+mark+" m-1", "hit "+begin+" m-1", "hit "+begin+" m-1", "kill "+mark+" d-1")
	rows := attribute(l, map[string]subjectFacts{
		"p-1": {producer: "orders", topic: "orders.probe", copies: 2},
		"m-1": paid(subjectFacts{topic: "orders.events", applied: 1, copies: 2, dups: 1}),
		"d-1": {producer: "orders", topic: "orders.dlq", copies: 1},
	})
	var probe, dlq, events WindowRow
	for _, r := range rows {
		switch {
		case r.Topic == "orders.probe":
			probe = r
		case r.Topic == "orders.dlq":
			dlq = r
		case r.Consumer == "inventory":
			events = r
		}
	}
	if probe.Kills != 1 || probe.Redelivered != 1 || probe.Consumer != "" || probe.CopiesMetEffect != 0 {
		t.Errorf("probe row %+v: want 1 kill, seen again by its 2 copies, no consumer, no effect to meet", probe)
	}
	if dlq.Kills != 1 || dlq.Redelivered != 0 {
		t.Errorf("dead letter row %+v: want 1 kill, one copy: not seen again", dlq)
	}
	if events.Kills != 1 || events.CopiesMetEffect != 1 {
		t.Errorf("the events' row %+v: want its one kill alone", events)
	}
	if ok, detail, _, _ := AttributionVerdict(rows, true, true); !strings.Contains(detail, mark+"/orders/orders.dlq: 1 kills, no subject seen again") || ok {
		t.Errorf("verdict %v %q: want the dead letter's row named by its topic", ok, detail)
	}
}

// TestConcurrentCopyIsConsumedAgain: a copy another process began before
// the kill (two consumers held the partition at once, during a failover's
// rebalance) and took on after it, its inbox insert waiting for the killed
// transaction's, is the subject seen again (a failover run once failed
// attribution with "after-inbox-insert/orders: 1 kills, no subject seen
// again" for one).
func TestConcurrentCopyIsConsumedAgain(t *testing.T) {
	in := "failpoint before-begin hit: pid 8 subject m-1\n" +
		"failpoint before-begin hit: pid 7 subject m-1\n" +
		"failpoint after-inbox-insert hit: pid 7 subject m-1\n" +
		"failpoint after-inbox-insert fired: SIGKILL pid 7 subject m-1\n"
	l, err := ParseLog(strings.NewReader(in), true)
	if err != nil {
		t.Fatal(err)
	}
	if l.consumedAgain(l.Kills[0]) {
		t.Fatal("a delivery begun before the kill, and nothing after, counted as consumed again")
	}
	l, _ = ParseLog(strings.NewReader(in+"failpoint after-inbox-insert hit: pid 8 subject m-1\n"), true)
	if !l.consumedAgain(l.Kills[0]) {
		t.Fatal("the other process's copy, inserted after the kill, was not seen")
	}
}
