// Package trace checks a chaos run's failpoint log against the protocol's
// Promela model (chaos/model/protocol.pml): every process's steps on every subject
// must be steps the model's process of that kind can take one after the
// other, and every kill must land inside the window it names.
//
// The model's state machines, as Spin compiles them, are reduced to one
// automaton per process type over the crash windows (Derive): which window a
// subject (a message, an order, an effect's key) meets first, which window
// can follow which, and after which the process can leave the subject. The
// automata live in automata.json; TestAutomataAreTheModels derives them
// again from the model with Spin and fails when the file differs (MODEL_TRACE_UPDATE=1
// go test ./chaos/model/trace writes it), so a change to the model reaches the
// chaos runs' check.
//
// A failpoint log (pkg/failpoint, FAILPOINT_TRACE listing every window) has
// a line for every window a process reaches ("failpoint W hit: pid P
// subject S") and one for each kill ("failpoint W fired: SIGKILL pid P
// subject S"). Check projects the log on each (process, kind, subject) and
// runs the kind's automaton over it:
//
//   - a subject starts at one of its kind's first windows;
//   - a step W→V is one the model takes: V follows W in the automaton, or V
//     starts a subject again after W, where the model can leave one;
//   - a kill in W comes right after the same process's hit of W on the same
//     subject (pkg/failpoint writes both under one lock): the window's code
//     was reached, and nothing after it;
//   - a killed process writes nothing after its kill line.
//
// What the projection leaves out: which subjects the bounded model has (two
// orders, three rows) and the order between processes; the chaos harness's
// own invariants judge those (attribution, ordering, counts).
package trace

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Automaton is the model's processes reduced to their crash windows, for
// one variant of the model (its -D flags: "" for the protocol as built, or a
// control's switch such as INBOX_OFF).
type Automaton struct {
	Variant string `json:"variant"`
	Roles   []Role `json:"roles"`
}

// Role is one process type of the model (proctype) and its windows.
type Role struct {
	Proctype string              `json:"proctype"`
	Windows  []string            `json:"windows"` // pkg/failpoint names
	Entry    []string            `json:"entry"`   // the windows a subject meets first
	Next     map[string][]string `json:"next"`    // window → the windows the process can meet next
	Exit     []string            `json:"exit"`    // windows after which the process can leave the subject
}

func (r *Role) sort() {
	slices.Sort(r.Windows)
	slices.Sort(r.Entry)
	slices.Sort(r.Exit)
	for w := range r.Next {
		slices.Sort(r.Next[w])
	}
}

//go:embed automata.json
var automataJSON []byte

// Variants are the model's variants the chaos runs use, by their -D flags:
// the protocol as built, and the inbox's dedupe off (the control runs).
var Variants = []string{"", "INBOX_OFF"}

// Load returns the embedded automaton of variant ("" or "INBOX_OFF").
func Load(variant string) (Automaton, error) {
	var all []Automaton
	if err := json.Unmarshal(automataJSON, &all); err != nil {
		return Automaton{}, fmt.Errorf("trace: automata.json: %w", err)
	}
	for _, a := range all {
		if a.Variant == variant {
			return a, nil
		}
	}
	return Automaton{}, fmt.Errorf("trace: no automaton for the model's variant %q (MODEL_TRACE_UPDATE=1 go test ./chaos/model/trace)", variant)
}

// Step is one line of a failpoint log.
type Step struct {
	Line    int // 1-based
	Window  string
	Pid     int
	Subject string
	Kill    bool
}

func (s Step) String() string {
	verb := "hit"
	if s.Kill {
		verb = "fired (SIGKILL)"
	}
	return fmt.Sprintf("line %d: %s %s by pid %d on %s", s.Line, s.Window, verb, s.Pid, s.Subject)
}

// Violation is a step the model does not allow, and why.
type Violation struct {
	Step Step
	Why  string
}

func (v Violation) String() string { return v.Step.String() + ": " + v.Why }

// Report is what Check found.
type Report struct {
	Variant    string
	Steps      int            // lines read
	Subjects   int            // (process, kind, subject) projections checked
	Kills      map[string]int // kills shown inside their window, by window
	Violations []Violation    // every step the model does not allow, in log order
}

// OK reports whether every step was allowed.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Summary says in one line what was checked and, when something was not
// allowed, the first such step.
func (r Report) Summary() string {
	kills := 0
	for _, n := range r.Kills {
		kills += n
	}
	s := fmt.Sprintf("trace vs model (%s): %d steps, %d process×subject projections, %d kills inside their windows",
		variantName(r.Variant), r.Steps, r.Subjects, kills)
	if !r.OK() {
		s += fmt.Sprintf("; %d steps the model does not allow, the first: %s", len(r.Violations), r.Violations[0])
	}
	return s
}

func variantName(v string) string {
	if v == "" {
		return "the protocol as built"
	}
	return "-D" + v
}

// ParseLine reads one failpoint log line; ok is false for a line that is
// not one (a failpoint log holds nothing else, so Check calls that a
// violation).
func ParseLine(line string) (s Step, ok bool) {
	// failpoint W hit: pid P subject S
	// failpoint W fired: SIGKILL pid P subject S
	// S is one field (failpoint.LoggedSubject), empty for a message without an id.
	f := strings.Fields(line)
	if len(f) == 6 || len(f) == 7 && f[2] == "fired:" {
		f = append(f, "")
	}
	switch {
	case len(f) == 7 && f[0] == "failpoint" && f[2] == "hit:" && f[3] == "pid" && f[5] == "subject":
		s = Step{Window: f[1], Subject: f[6]}
		s.Pid, ok = atoiOK(f[4])
	case len(f) == 8 && f[0] == "failpoint" && f[2] == "fired:" && f[3] == "SIGKILL" && f[4] == "pid" && f[6] == "subject":
		s = Step{Window: f[1], Subject: f[7], Kill: true}
		s.Pid, ok = atoiOK(f[5])
	}
	return s, ok
}

func atoiOK(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// Check reads a failpoint log and checks every step against a.
func (a Automaton) Check(log io.Reader) (Report, error) {
	role := map[string]*Role{}
	for i := range a.Roles {
		for _, w := range a.Roles[i].Windows {
			role[w] = &a.Roles[i]
		}
	}
	type key struct {
		pid           int
		kind, subject string
	}
	// runs holds, per projection, the last window of each of its runs in
	// flight: one process can hold two copies of a subject at once (the
	// same message id on two partitions, a capture's lease overtaken), each
	// a run of the model's process on its own.
	runs := map[key][]string{}
	dead := map[int]Step{}     // pid → its kill line
	lastLine := map[int]Step{} // pid → its last hit line
	rep := Report{Variant: a.Variant, Kills: map[string]int{}}
	bad := func(s Step, why string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{s, fmt.Sprintf(why, args...)})
	}
	sc := bufio.NewScanner(log)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		s, ok := ParseLine(text)
		s.Line = n
		if !ok {
			bad(s, "not a failpoint line: %q", text)
			continue
		}
		if k, ok := dead[s.Pid]; ok {
			bad(s, "pid %d was killed at line %d (%s): a killed process writes nothing more", s.Pid, k.Line, k.Window)
			continue
		}
		r := role[s.Window]
		if r == nil {
			bad(s, "the model has no window %q", s.Window)
			continue
		}
		k := key{s.Pid, r.Proctype, s.Subject}
		open, seen := runs[k]
		if !seen {
			rep.Subjects++
		}
		if s.Kill {
			dead[s.Pid] = s
			// The kill comes right after its window's hit (pkg/failpoint
			// writes both under one lock): the last line of this pid, on
			// this subject, in this window.
			if prevLine, ok := lastLine[s.Pid]; !ok || prevLine.Window != s.Window || prevLine.Subject != s.Subject || !slices.Contains(open, s.Window) {
				was := "nothing"
				if ok {
					was = fmt.Sprintf("%s on %s", prevLine.Window, prevLine.Subject)
				}
				bad(s, "a kill in %s on %s, but pid %d's step before it was %s: the kill is outside its window", s.Window, s.Subject, s.Pid, was)
				continue
			}
			rep.Kills[s.Window]++
			continue
		}
		lastLine[s.Pid] = s
		// A step continues the run it follows in the model; a window
		// subjects begin at may also begin a run of its own.
		i := slices.IndexFunc(open, func(prev string) bool { return r.continues(prev, s.Window) })
		switch {
		case i >= 0:
			open[i] = s.Window
		case slices.Contains(r.Entry, s.Window):
			open = append(open, s.Window)
		default:
			why := r.step("", s.Window)
			if len(open) > 0 {
				why = r.step(open[len(open)-1], s.Window)
			}
			bad(s, "%s (model process %s)", why, r.Proctype)
			continue
		}
		runs[k] = open
	}
	rep.Steps = n
	return rep, sc.Err()
}

// continues reports whether w continues a run whose last window is prev:
// the model goes from prev to w, without beginning a subject again.
func (r *Role) continues(prev, w string) bool {
	return !slices.Contains(r.Entry, w) && slices.Contains(r.Next[prev], w)
}

// step says why w cannot follow prev ("" for a subject's first step) in
// this process type, or "" when it can.
func (r *Role) step(prev, w string) string {
	entry := slices.Contains(r.Entry, w)
	if prev == "" {
		if entry {
			return ""
		}
		return fmt.Sprintf("a subject begins at %s; the model's begin at %s", w, strings.Join(r.Entry, " or "))
	}
	if !entry && slices.Contains(r.Next[prev], w) {
		return ""
	}
	if entry && slices.Contains(r.Exit, prev) {
		return ""
	}
	var can []string
	for _, v := range r.Next[prev] {
		if !slices.Contains(r.Entry, v) {
			can = append(can, v)
		}
	}
	if slices.Contains(r.Exit, prev) {
		can = append(can, r.Entry...)
	}
	return fmt.Sprintf("%s after %s; the model goes from %s to %s", w, prev, prev, strings.Join(can, " or "))
}
