// Package model holds the Promela model of the protocol (protocol.pml),
// which Spin checks (check.sh, make model; docs/model.md). This test keeps
// the model's crash windows and pkg/failpoint's the same: a window added to
// the code and not to the model, or the other way round, fails it.
package model

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// modelName is a window's name as the model writes it: Promela names cannot
// hold '-', so '_' stands for it.
func modelName(n failpoint.Name) string { return strings.ReplaceAll(string(n), "-", "_") }

var (
	// the model's only mtype: the crash windows
	mtypeRE = regexp.MustCompile(`(?m)^mtype\s*=\s*\{([^}]*)\}`)
	// a crash point: CRASH(window, how the process dies, where it restarts)
	crashRE = regexp.MustCompile(`(?m)^[^*#\n]*\bCRASH\(([a-z_]+),`)
	comment = regexp.MustCompile(`(?s)/\*.*?\*/`)
)

// windows reads the model's list of windows and the windows its CRASH
// points name.
func windows(t *testing.T, src string) (declared, crashes []string) {
	t.Helper()
	m := mtypeRE.FindStringSubmatch(src)
	if m == nil {
		t.Fatal("protocol.pml: no `mtype = { ... }` list of crash windows")
	}
	for _, f := range strings.Split(comment.ReplaceAllString(m[1], ""), ",") {
		if f = strings.TrimSpace(f); f != "" {
			declared = append(declared, f)
		}
	}
	for _, c := range crashRE.FindAllStringSubmatch(src, -1) {
		crashes = append(crashes, c[1])
	}
	return declared, crashes
}

// compare reports, for the code's windows want and the model's declared
// list and crash points, every window one side has and the other lacks.
func compare(want []failpoint.Name, declared, crashes []string) []string {
	var problems []string
	code := map[string]bool{}
	for _, n := range want {
		code[modelName(n)] = true
		if !slices.Contains(declared, modelName(n)) {
			problems = append(problems, "pkg/failpoint window "+string(n)+" is not in the model's mtype list (as "+modelName(n)+")")
		}
		if !slices.Contains(crashes, modelName(n)) {
			problems = append(problems, "pkg/failpoint window "+string(n)+" is no CRASH point of the model: no process of the model can die there")
		}
	}
	for _, d := range declared {
		if !code[d] {
			problems = append(problems, "the model's window "+d+" is not in pkg/failpoint.All")
		}
	}
	for _, c := range crashes {
		if !code[c] {
			problems = append(problems, "the model crashes in "+c+", which is not in pkg/failpoint.All")
		}
	}
	return problems
}

// declaredWindows reads the constants of type Name that
// pkg/failpoint/failpoint.go declares: a window declared there and not put
// in All must not escape the comparison.
func declaredWindows(t *testing.T) []failpoint.Name {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../pkg/failpoint/failpoint.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []failpoint.Name
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Name" {
				continue
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					names = append(names, failpoint.Name(s))
				}
			}
		}
	}
	return names
}

func TestEveryWindowIsInAll(t *testing.T) {
	consts := declaredWindows(t)
	if len(consts) == 0 {
		t.Fatal("read no constant of type Name from pkg/failpoint/failpoint.go")
	}
	for _, c := range consts {
		if !slices.Contains(failpoint.All, c) {
			t.Errorf("pkg/failpoint declares the window %s and leaves it out of All", c)
		}
	}
	if len(consts) != len(failpoint.All) {
		t.Errorf("pkg/failpoint declares %d windows, All lists %d", len(consts), len(failpoint.All))
	}
}

func TestWindowsMatchFailpoint(t *testing.T) {
	src, err := os.ReadFile("protocol.pml")
	if err != nil {
		t.Fatal(err)
	}
	declared, crashes := windows(t, string(src))
	for _, p := range compare(failpoint.All, declared, crashes) {
		t.Error(p)
	}
	if len(declared) != len(failpoint.All) {
		t.Errorf("the model lists %d windows, pkg/failpoint.All %d", len(declared), len(failpoint.All))
	}
}

// TestCompareSeesAMissingWindow holds the comparison able to fail, on a
// model and a window list of its own: a window only the code has, only the
// model has, or declared with no process dying in it, is reported.
func TestCompareSeesAMissingWindow(t *testing.T) {
	src := `/* a model: CRASH(not_this, ...) in a comment is no crash point */
mtype = { /* windows */ before_begin, after_commit_before_ack };
#define CRASH(w, die, where) skip
proctype C() {
	CRASH(before_begin, skip, restart);
	if :: fresh -> CRASH(after_commit_before_ack, skip, restart) :: else fi
}`
	declared, crashes := windows(t, src)
	if want := []string{"before_begin", "after_commit_before_ack"}; !slices.Equal(declared, want) || !slices.Equal(crashes, want) {
		t.Fatalf("read declared %q, crash points %q; want %q for both", declared, crashes, want)
	}
	code := []failpoint.Name{failpoint.BeforeBegin, failpoint.AfterCommitBeforeAck}
	if p := compare(code, declared, crashes); len(p) != 0 {
		t.Errorf("the same windows: %q, want no problem", p)
	}
	if p := compare(append(slices.Clone(code), "after-something-new"), declared, crashes); len(p) != 2 {
		t.Errorf("a window only the code has: %q, want 2 problems (not declared, no crash point)", p)
	}
	if p := compare(code[1:], declared, crashes); len(p) != 2 {
		t.Errorf("a window only the model has: %q, want 2 problems (declared, crash point)", p)
	}
	if p := compare(code, declared, crashes[1:]); len(p) != 1 {
		t.Errorf("a declared window with no crash point: %q, want 1 problem", p)
	}
}
