package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// update: MODEL_TRACE_UPDATE=1 writes automata.json from the model.
var update = os.Getenv("MODEL_TRACE_UPDATE") == "1"

// deriveAll compiles the model once per variant with Spin and derives its
// automaton from `pan -d`.
func deriveAll(t *testing.T) []Automaton {
	t.Helper()
	for _, tool := range []string{"spin", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("REQUIRE_SPIN") != "" {
				t.Fatalf("%s is not installed, and REQUIRE_SPIN is set (.ci/run): the automata must be checked against the model", tool)
			}
			t.Skipf("%s is not installed (apt-get install spin gcc): automata.json is not checked against the model", tool)
		}
	}
	pml, err := os.ReadFile("../protocol.pml")
	if err != nil {
		t.Fatal(err)
	}
	var all []Automaton
	for _, v := range Variants {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "protocol.pml"), pml, 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"-DROW=2"}
		if v != "" {
			args = append(args, "-D"+v)
		}
		run(t, dir, "spin", append(args, "-a", "protocol.pml")...)
		run(t, dir, "gcc", "-DSAFETY", "-DNOCLAIM", "-w", "-o", "pan", "pan.c")
		out := run(t, dir, "./pan", "-d")
		a, err := Derive(bytes.NewReader(out), string(pml), v)
		if err != nil {
			t.Fatalf("variant %q: %v", v, err)
		}
		all = append(all, a)
	}
	return all
}

func run(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// TestAutomataAreTheModels derives the automata from protocol.pml again and
// requires automata.json to be what it gives: the chaos runs check their
// traces against the model as it is.
func TestAutomataAreTheModels(t *testing.T) {
	all := deriveAll(t)
	got, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if update {
		if err := os.WriteFile("automata.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(got, automataJSON) {
		t.Fatalf("automata.json is not what chaos/model/protocol.pml gives: run MODEL_TRACE_UPDATE=1 go test ./chaos/model/trace and read the diff\n%s", got)
	}
}
