package trace

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Derive reads the model's state machines as Spin prints them (`pan -d` of
// protocol.pml compiled with the variant's -D flags) and the model's source
// (to name the window of each CRASH point) and returns, for each process
// type with crash windows, the windows it can meet one after the other.
//
// A CRASH(w, ...) point compiles to a state with two ways on: the crash
// (`crashes < MAXCRASH`: the process dies and restarts where the macro says)
// and the way through (`1`). From the start of the process, every restart
// and every way through, Derive follows the state machine until it meets the
// next CRASH point (a window the process can hit next), an end state or the
// process's end (it can stop there, waiting or done).
func Derive(panD io.Reader, pml string, variant string) (Automaton, error) {
	lines := strings.Split(pml, "\n")
	a := Automaton{Variant: variant}
	var cur *proc
	var procs []*proc
	sc := bufio.NewScanner(panD)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "proctype "); ok {
			cur = &proc{name: strings.TrimSpace(name), out: map[int][]tr{}}
			procs = append(procs, cur)
			continue
		}
		m := panLine.FindStringSubmatch(line)
		if m == nil || cur == nil {
			continue
		}
		src, _ := strconv.Atoi(m[1])
		dst, _ := strconv.Atoi(m[2])
		ln, _ := strconv.Atoi(m[4])
		t := tr{src: src, dst: dst, endState: len(m[3]) > 2 && m[3][2] == 'e', line: ln, text: m[5]}
		if !cur.seen {
			cur.seen, cur.initial = true, src
		}
		cur.out[src] = append(cur.out[src], t)
	}
	if err := sc.Err(); err != nil {
		return Automaton{}, err
	}
	for _, p := range procs {
		r, err := p.role(lines)
		if err != nil {
			return Automaton{}, err
		}
		if len(r.Windows) > 0 {
			a.Roles = append(a.Roles, r)
		}
	}
	if len(a.Roles) == 0 {
		return Automaton{}, fmt.Errorf("trace: no CRASH point in the state machines (was pan -d given?)")
	}
	return a, nil
}

// a transition line of pan -d:
//
//	state  19 -(tr  31)-> state  15  [id 623 tp   2] [A---G] protocol.pml:413 => ((crashes<2))
var panLine = regexp.MustCompile(`^\s*state\s+(\d+)\s+-\(tr\s+\d+\)->\s+state\s+(\d+)\s+\[id\s+\d+\s+tp\s+\d+\]\s+\[([A-Za-z-]+)\]\s+\S+:(\d+)\s+=>\s+(.*)$`)

// a crash point in the source: CRASH(window, how it dies, where it restarts)
var crashCall = regexp.MustCompile(`\bCRASH\(([a-z_]+),`)

type tr struct {
	src, dst int
	endState bool // the source is a valid end state (an end label: the process may wait there)
	line     int
	text     string
}

type proc struct {
	name    string
	seen    bool
	initial int
	out     map[int][]tr
}

// role derives the process type's windows from its state machine.
func (p *proc) role(src []string) (Role, error) {
	hit := map[int]string{}  // state → the window whose CRASH point it is
	through := map[int]int{} // a CRASH point's state → where the way through leads
	seeds := []int{p.initial}
	for s, ts := range p.out {
		for _, t := range ts {
			if !strings.HasPrefix(t.text, "((crashes<") {
				continue
			}
			if t.line < 1 || t.line > len(src) {
				return Role{}, fmt.Errorf("trace: %s: line %d is not in the model", p.name, t.line)
			}
			m := crashCall.FindStringSubmatch(src[t.line-1])
			if m == nil {
				return Role{}, fmt.Errorf("trace: %s: a crash at protocol.pml:%d names no window", p.name, t.line)
			}
			hit[s] = failpointName(m[1])
			seeds = append(seeds, t.dst) // the crash: the process restarts from here
			for _, u := range ts {
				if u.line == t.line && u.text == "(1)" {
					through[s] = u.dst
				}
			}
			if _, ok := through[s]; !ok {
				return Role{}, fmt.Errorf("trace: %s: the crash point at protocol.pml:%d has no way through", p.name, t.line)
			}
		}
	}
	r := Role{Proctype: p.name, Next: map[string][]string{}}
	if len(hit) == 0 {
		return r, nil
	}
	r.Entry, _ = p.reach(seeds, hit)
	entry := map[string]bool{}
	for _, w := range r.Entry {
		entry[w] = true
	}
	for s, w := range hit {
		if !slices.Contains(r.Windows, w) {
			r.Windows = append(r.Windows, w)
		}
		next, canEnd := p.reach([]int{through[s]}, hit)
		for _, v := range next {
			if !slices.Contains(r.Next[w], v) {
				r.Next[w] = append(r.Next[w], v)
			}
			canEnd = canEnd || entry[v]
		}
		if canEnd && !slices.Contains(r.Exit, w) {
			r.Exit = append(r.Exit, w)
		}
	}
	r.sort()
	return r, nil
}

// reach follows the state machine from seeds up to the CRASH points it meets
// (their windows, returned) and reports whether it meets an end state or the
// process's end on the way.
func (p *proc) reach(seeds []int, hit map[int]string) (windows []string, canEnd bool) {
	seen := map[int]bool{}
	stack := slices.Clone(seeds)
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[s] {
			continue
		}
		seen[s] = true
		if w, ok := hit[s]; ok {
			if !slices.Contains(windows, w) {
				windows = append(windows, w)
			}
			continue
		}
		for _, t := range p.out[s] {
			if t.endState || t.text == "-end-" {
				canEnd = true
			}
			stack = append(stack, t.dst)
		}
		if len(p.out[s]) == 0 {
			canEnd = true // state 0: the process has ended
		}
	}
	slices.Sort(windows)
	return windows, canEnd
}

// failpointName is a model's window name as pkg/failpoint writes it.
func failpointName(model string) string { return strings.ReplaceAll(model, "_", "-") }
