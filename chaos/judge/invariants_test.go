package judge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// repoRoot is where the rules' paths are relative to.
const repoRoot = "../.."

// stringConsts maps the package's string constants' names to their values.
func stringConsts(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, f := range pkgs["judge"].Files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						consts[name.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
			return true
		})
	}
	return consts
}

// TestEveryVerdictHasARule: every invariant a verdict names, in this
// package (an Invariant built) or in the chaos driver (a report's
// invariant set), has its rule; and no rule names an invariant nothing
// judges.
func TestEveryVerdictHasARule(t *testing.T) {
	consts := stringConsts(t)
	judged := map[string]string{} // invariant → where it is set
	scan := func(glob string, re *regexp.Regexp) {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range re.FindAllSubmatch(b, -1) {
				name, ok := consts[string(m[1])]
				if !ok {
					t.Errorf("%s: %s is no string constant of chaos/judge", f, m[1])
				}
				judged[name] = f
			}
		}
	}
	scan("*.go", regexp.MustCompile(`Invariant\{(?:Name:\s*)?(\w+),`))
	scan(filepath.Join(repoRoot, "chaos", "*.go"), regexp.MustCompile(`Invariants\[judge\.(\w+)\][^=\n]*=[^=]`))
	if len(judged) < 10 {
		t.Fatalf("found %d invariants judged: the scan is broken: %v", len(judged), judged)
	}
	ruled := map[string]bool{}
	for _, r := range Rules {
		if ruled[r.Name] {
			t.Errorf("rule %s twice", r.Name)
		}
		ruled[r.Name] = true
		if judged[r.Name] == "" {
			t.Errorf("rule %s: no verdict sets it", r.Name)
		}
	}
	for name, where := range judged {
		if !ruled[name] {
			t.Errorf("%s judges %s, which has no rule in Rules", where, name)
		}
	}
}

// TestEveryRuleHasAPlaceAndAControl: the functions a rule names exist in
// the files it names, and so does every control: a test function, or a
// chaos run of make chaos-ci with those flags.
func TestEveryRuleHasAPlaceAndAControl(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			t.Errorf("%v", err)
		}
		return string(b)
	}
	for _, r := range Rules {
		if r.Says == "" || len(r.Controls) == 0 {
			t.Errorf("%s: says nothing, or has no control", r.Name)
		}
		for _, place := range strings.Split(r.JudgedBy, ", ") {
			file, fn, _ := strings.Cut(place, " ")
			fn, _, _ = strings.Cut(fn, " ")
			if !regexp.MustCompile(`(?m)^func (\(\w+ \*?\w+\) )?` + fn + `[\[(]`).MatchString(read(file)) {
				t.Errorf("%s: %s has no func %s", r.Name, file, fn)
			}
		}
		for _, c := range r.Controls {
			src := read(c.File)
			switch {
			case c.File == "Makefile":
				// The block that runs chaos with those flags must also
				// require the report to show this invariant failed.
				run := regexp.MustCompile(`\./bin/chaos [^\n]*` + regexp.QuoteMeta(c.Name))
				failed := regexp.MustCompile(`"` + regexp.QuoteMeta(r.Name) + `": false|"failed": "[^\n]*` + regexp.QuoteMeta(r.Name))
				found := false
				for _, block := range strings.Split(src, "\ndefine ") {
					block, _, _ = strings.Cut(block, "\nendef")
					if run.MatchString(block) && failed.MatchString(block) {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: no Makefile block runs chaos with %s and requires %s to fail", r.Name, c.Name, r.Name)
				}
			case !strings.HasSuffix(c.File, "_test.go"):
				t.Errorf("%s: control %s is neither a test nor the Makefile", r.Name, c)
			case !strings.Contains(src, "\nfunc "+c.Name+"(t *testing.T)"):
				t.Errorf("%s: %s has no %s", r.Name, c.File, c.Name)
			}
		}
	}
}

func TestLayersVerdict(t *testing.T) {
	if ok, _ := LayersVerdict(true, 10, 0, nil); !ok {
		t.Error("inbox on, no own event refused: must pass")
	}
	if ok, d := LayersVerdict(true, 10, 1, nil); ok {
		t.Errorf("inbox on, an own event reached the guard: must fail (%s)", d)
	}
	if ok, _ := LayersVerdict(false, 0, 3, nil); !ok {
		t.Error("inbox off, the guard refused redeliveries: must pass")
	}
	if ok, d := LayersVerdict(false, 0, 0, nil); ok {
		t.Errorf("inbox off, nothing reached the guard: must fail (%s)", d)
	}
}

func TestHostileVerdict(t *testing.T) {
	if ok, _ := HostileVerdict(true, map[string]bool{"bad-json": true, "forged": true}); !ok {
		t.Error("every class handled: must pass")
	}
	ok, d := HostileVerdict(true, map[string]bool{"bad-json": true, "forged": false})
	if ok || !strings.Contains(d, "not caught: forged") {
		t.Errorf("a class not handled: must fail naming it, got %t %q", ok, d)
	}
	if ok, d := HostileVerdict(false, nil); ok {
		t.Errorf("nothing sent: must fail (%s)", d)
	}
	if ok, d := HostileVerdict(true, nil); ok {
		t.Errorf("sent, nothing recorded: must fail (%s)", d)
	}
}

func TestFaultsBitVerdict(t *testing.T) {
	least := Minimums{PerWindow: 1, Kills: 10, PostgresRestarts: 1, BrokerKills: 1, Pauses: 1, ClusterRestarts: 1, Kinds: 2}
	full := func() Reach {
		r := Reach{Kills: map[failpoint.Name]int{}, Reached: failpoint.All, RandomKills: 1, PostgresRestarts: 1, Inbox: true, Suppressed: 5,
			Apache: true, BrokerKills: 1, LeaderChanges: 1, Pauses: 1, ClusterRestarts: 1, Net: true, NetFaults: 4, NetKinds: 2}
		for _, w := range failpoint.All {
			r.Kills[w] = 2
		}
		return r
	}
	ok, d, total := FaultsBitVerdict(full(), least)
	if !ok || total != 2*len(failpoint.All)+1 {
		t.Fatalf("every minimum reached: must pass with %d kills, got %t, %d: %s", 2*len(failpoint.All)+1, ok, total, d)
	}
	for name, short := range map[string]func(*Reach){
		"a window short":          func(r *Reach) { r.Kills[failpoint.AfterCommitBeforeAck] = 0 },
		"no postgres restart":     func(r *Reach) { r.PostgresRestarts = 0 },
		"no leader change":        func(r *Reach) { r.LeaderChanges = 0 },
		"one network fault kind":  func(r *Reach) { r.NetKinds = 1 },
		"no duplicate suppressed": func(r *Reach) { r.Suppressed = 0 },
		"too few kills in all":    func(r *Reach) { clear(r.Kills); r.Reached = nil },
		"no full-cluster restart": func(r *Reach) { r.ClusterRestarts = 0 },
	} {
		r := full()
		short(&r)
		if ok, d, _ := FaultsBitVerdict(r, least); ok {
			t.Errorf("%s: must fail (%s)", name, d)
		}
	}
	r := full()
	r.Kills[failpoint.AfterCommitBeforeAck], r.Reached = 0, slices.DeleteFunc(slices.Clone(failpoint.All), func(w failpoint.Name) bool { return w == failpoint.AfterCommitBeforeAck })
	if ok, d, _ := FaultsBitVerdict(r, least); !ok {
		t.Errorf("a window this mode does not reach is not held to its minimum: %s", d)
	}
}

// rulesTable renders Rules as docs/chaos.md shows them.
func rulesTable() string {
	var b strings.Builder
	b.WriteString("| invariant | what it says | judged by | controls that must see it fail |\n|---|---|---|---|\n")
	for _, r := range Rules {
		var controls []string
		for _, c := range r.Controls {
			controls = append(controls, "`"+c.String()+"`")
		}
		var judged []string
		for _, place := range strings.Split(r.JudgedBy, ", ") {
			judged = append(judged, "`"+place+"`")
		}
		b.WriteString("| `" + r.Name + "` | " + r.Says + " | " + strings.Join(judged, ", ") + " | " + strings.Join(controls, ", ") + " |\n")
	}
	return b.String()
}

// TestRulesTableInDocs: docs/chaos.md shows Rules as they are.
func TestRulesTableInDocs(t *testing.T) {
	path := filepath.Join(repoRoot, "docs", "chaos.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?s)(<!-- rules:[^\n]*-->\n)(.*?)(<!-- /rules -->)`)
	m := re.FindSubmatchIndex(b)
	if m == nil {
		t.Fatalf("%s: no <!-- rules: --> … <!-- /rules --> block", path)
	}
	want := rulesTable()
	if got := string(b[m[4]:m[5]]); got != want {
		if os.Getenv("JUDGE_RULES_UPDATE") != "" {
			out := append(append(append([]byte{}, b[:m[4]]...), want...), b[m[5]:]...)
			if err := os.WriteFile(path, out, 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s's table of rules is not Rules (JUDGE_RULES_UPDATE=1 go test ./chaos/judge -run TestRulesTableInDocs rewrites it):\n%s", path, want)
	}
}
