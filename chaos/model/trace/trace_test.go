package trace

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

// fixture is the start of a real chaos run's failpoint log (go run ./chaos
// -profile smoke -seed 7, every window traced): 9,830 lines, 23 kills, in
// every one of the nine windows.
func fixture(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("testdata/smoke-seed7.log.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func check(t *testing.T, variant string, lines []string) Report {
	t.Helper()
	a, err := Load(variant)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := a.Check(strings.NewReader(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestARealRunIsInTheModel(t *testing.T) {
	rep := check(t, "", fixture(t))
	if !rep.OK() {
		t.Fatalf("%s\nall: %v", rep.Summary(), rep.Violations)
	}
	for _, w := range []string{"after-commit-before-response", "after-claim-before-publish", "after-publish-before-mark",
		"before-begin", "after-inbox-insert", "after-handler-before-commit", "after-commit-before-ack",
		"before-effect", "after-effect-before-record"} {
		if rep.Kills[w] == 0 {
			t.Errorf("no kill shown inside %s: the fixture should hold one of each", w)
		}
	}
	t.Log(rep.Summary())
}

// projection is one (process, kind, subject)'s steps: their line indexes.
func projections(t *testing.T, lines []string) [][]int {
	t.Helper()
	a, _ := Load("")
	kind := map[string]string{}
	for _, r := range a.Roles {
		for _, w := range r.Windows {
			kind[w] = r.Proctype
		}
	}
	idx := map[string]int{}
	var out [][]int
	for i, l := range lines {
		s, ok := ParseLine(l)
		if !ok {
			t.Fatalf("fixture line %d: %q", i+1, l)
		}
		k := fmt.Sprint(s.Pid, kind[s.Window], s.Subject)
		j, ok := idx[k]
		if !ok {
			j = len(out)
			idx[k] = j
			out = append(out, nil)
		}
		out[j] = append(out[j], i)
	}
	return out
}

// find returns the line indexes of the first projection whose windows
// (kills written "!window") start with want.
func find(t *testing.T, lines []string, want ...string) []int {
	t.Helper()
	for _, p := range projections(t, lines) {
		if len(p) < len(want) {
			continue
		}
		ok := true
		for j, w := range want {
			s, _ := ParseLine(lines[p[j]])
			got := s.Window
			if s.Kill {
				got = "!" + got
			}
			if got != w {
				ok = false
				break
			}
		}
		if ok {
			return p[:len(want)]
		}
	}
	t.Fatalf("the fixture has no subject with steps %v", want)
	return nil
}

func swap(lines []string, i, j int) []string {
	m := slices.Clone(lines)
	m[i], m[j] = m[j], m[i]
	return m
}

func rename(lines []string, i int, from, to string) []string {
	m := slices.Clone(lines)
	m[i] = strings.Replace(m[i], " "+from+" ", " "+to+" ", 1)
	return m
}

// TestMutationsAreRejected: the real trace with one step swapped, one
// window renamed, or a line written by a dead process, fails the check, and
// the first step it names is a mutated one.
func TestMutationsAreRejected(t *testing.T) {
	lines := fixture(t)
	const (
		bb, aii, ahbc, acba = "before-begin", "after-inbox-insert", "after-handler-before-commit", "after-commit-before-ack"
		acbp, apbm          = "after-claim-before-publish", "after-publish-before-mark"
		be, aebr            = "before-effect", "after-effect-before-record"
	)
	type mutation struct {
		name    string
		lines   []string
		mutated []int // line indexes a violation must name
	}
	var ms []mutation
	add := func(name string, lines []string, at ...int) { ms = append(ms, mutation{name, lines, at}) }

	d := find(t, lines, bb, aii, ahbc, acba)
	add("inbox insert and handler swapped", swap(lines, d[1], d[2]), d[1], d[2])
	add("begin and inbox insert swapped", swap(lines, d[0], d[1]), d[0], d[1])
	add("handler and commit swapped", swap(lines, d[2], d[3]), d[2], d[3])
	add("inbox insert renamed to the handler's window", rename(lines, d[1], aii, ahbc), d[1], d[2])
	add("inbox insert renamed to a window the model lacks", rename(lines, d[1], aii, "after-inbox-update"), d[1])
	add("the consumer's step renamed to a relay's", rename(lines, d[2], ahbc, apbm), d[2], d[3])
	r := find(t, lines, acbp, apbm)
	add("claim and publish swapped", swap(lines, r[0], r[1]), r[0], r[1])
	e := find(t, lines, be, aebr)
	add("call and record swapped", swap(lines, e[0], e[1]), e[0], e[1])
	k := find(t, lines, bb, aii, ahbc, "!"+ahbc)
	add("a kill swapped with its window's hit", swap(lines, k[2], k[3]), k[2], k[3])
	add("a kill renamed to the window before", rename(lines, k[3], ahbc, aii), k[3])
	after := slices.Insert(slices.Clone(lines), k[3]+1, lines[k[2]])
	add("a killed process writes on", after, k[3]+1)

	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			rep := check(t, "", m.lines)
			if rep.OK() {
				t.Fatalf("accepted: %s", rep.Summary())
			}
			first := rep.Violations[0].Step.Line - 1
			if !slices.Contains(m.mutated, first) {
				t.Fatalf("the first violation names line %d, not a mutated one (%v): %s", first+1, m.mutated, rep.Violations[0])
			}
			t.Log(rep.Violations[0])
		})
	}
}

// TestSwapsWithinADeliveryAreRejected swaps every two neighbouring steps
// of every consumer delivery, relay batch and effect call in the fixture
// that name different windows, and checks the one projection again.
func TestSwapsWithinADeliveryAreRejected(t *testing.T) {
	lines := fixture(t)
	a, _ := Load("")
	role := map[string]*Role{}
	for i := range a.Roles {
		for _, w := range a.Roles[i].Windows {
			role[w] = &a.Roles[i]
		}
	}
	accepts := func(steps []Step) bool {
		prev := ""
		for _, s := range steps {
			if s.Kill {
				if prev != s.Window {
					return false
				}
				continue
			}
			if role[s.Window].step(prev, s.Window) != "" {
				return false
			}
			prev = s.Window
		}
		return true
	}
	swaps, rejected := 0, 0
	for _, p := range projections(t, lines) {
		steps := make([]Step, len(p))
		for i, li := range p {
			steps[i], _ = ParseLine(lines[li])
		}
		if !accepts(steps) {
			t.Fatalf("the fixture's projection %v is not accepted", steps)
		}
		for i := 0; i+1 < len(steps); i++ {
			// two steps of one delivery: the second continues it (it is
			// not a window deliveries begin at), and the first does too,
			// or begins the projection's first delivery. (Other swaps move
			// a step between two deliveries, which can give another
			// behaviour of the model: a call that failed, then one that
			// succeeded.)
			entry := func(s Step) bool { return !s.Kill && slices.Contains(role[s.Window].Entry, s.Window) }
			if steps[i].Window == steps[i+1].Window || entry(steps[i+1]) || entry(steps[i]) && i > 0 {
				continue
			}
			m := slices.Clone(steps)
			m[i], m[i+1] = m[i+1], m[i]
			swaps++
			if !accepts(m) {
				rejected++
			} else {
				t.Logf("swap of steps %d and %d gives another behaviour of the model: %v", i, i+1, m)
			}
		}
	}
	t.Logf("%d of %d swaps within a delivery rejected", rejected, swaps)
	// A swap can give another behaviour of the model (a delivery whose
	// commit failed, tried again: inbox insert, handler, inbox insert), which
	// the check rightly accepts; in this trace at most one in a thousand.
	if swaps < 1000 || rejected*1000 < swaps*999 {
		t.Fatalf("%d of %d swaps rejected: want 999 in 1,000 of at least 1,000", rejected, swaps)
	}
}

// TestTheVariantMatters: a run with the inbox on is not a behaviour of the
// model with the inbox off (no inbox insert there), so a control run checked
// against the wrong model fails.
func TestTheVariantMatters(t *testing.T) {
	rep := check(t, "INBOX_OFF", fixture(t))
	if rep.OK() {
		t.Fatal("the inbox-on trace passed the inbox-off model")
	}
	if !strings.Contains(rep.Violations[0].Why, `no window "after-inbox-insert"`) {
		t.Fatalf("first violation: %s", rep.Violations[0])
	}
}

func TestParseLine(t *testing.T) {
	for _, c := range []struct {
		line string
		want Step
		ok   bool
	}{
		{"failpoint before-begin hit: pid 12 subject m-1", Step{Window: "before-begin", Pid: 12, Subject: "m-1"}, true},
		{"failpoint before-begin hit: pid 12 subject ", Step{Window: "before-begin", Pid: 12}, true},
		{"failpoint after-commit-before-ack fired: SIGKILL pid 7 subject m", Step{Window: "after-commit-before-ack", Pid: 7, Subject: "m", Kill: true}, true},
		{"failpoint before-begin hit: pid x subject m", Step{}, false},
		{"failpoint before-begin hit: pid 12 subject a b", Step{}, false},
		{"something else", Step{}, false},
	} {
		got, ok := ParseLine(c.line)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("ParseLine(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

// TestTwoCopiesInOneProcess: one process handles two copies of a message id
// at once (the same id on two partitions): each is a run of the model's
// consumer on its own, interleaved in the log, and the check takes both.
// Its steps out of the model's order are still refused.
func TestTwoCopiesInOneProcess(t *testing.T) {
	line := func(w string) string { return "failpoint " + w + " hit: pid 7 subject m-1" }
	interleaved := []string{
		line("before-begin"), line("after-inbox-insert"),
		line("before-begin"), // the second copy: another partition
		line("after-handler-before-commit"), line("after-commit-before-ack"),
		line("after-commit-before-ack"), // the second copy, a duplicate, settled
	}
	if rep := check(t, "", interleaved); !rep.OK() {
		t.Fatalf("two copies in one process refused: %v", rep.Violations)
	}
	wrong := []string{line("before-begin"), line("before-begin"), line("after-handler-before-commit")}
	if rep := check(t, "", wrong); rep.OK() {
		t.Fatal("a handler step with no inbox insert before it, in either copy, was taken")
	}
}
