//go:build failpoint

package failpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestConfigureRejectsBadSpecs(t *testing.T) {
	for _, spec := range []string{
		"nonsense",
		"no-such-window=p:0.5",
		"before-begin=p:1.5",
		"before-begin=every:0",
		"before-begin=sometimes",
	} {
		if err := Configure(spec, "", ""); err == nil {
			t.Errorf("Configure(%q) accepted a bad spec", spec)
		}
	}
	if err := Configure("before-begin=p:0.25, after-commit-before-ack=every:3", "7", ""); err != nil {
		t.Fatalf("a good spec was refused: %v", err)
	}
	t.Cleanup(func() { Configure("", "", "") }) //nolint:errcheck
	if !armed.Load() {
		t.Fatal("a configured window left the failpoints disarmed")
	}
	if err := Configure("", "", ""); err != nil || armed.Load() {
		t.Fatalf("an empty spec must disarm: err %v, armed %v", err, armed.Load())
	}
}

func TestUnarmedHitIsFree(t *testing.T) {
	Configure("", "", "") //nolint:errcheck
	if n := testing.AllocsPerRun(1000, func() { Hit(AfterCommitBeforeAck, "id") }); n != 0 {
		t.Fatalf("an unarmed Hit allocates %v times", n)
	}
}

// TestHitKillsWithSIGKILL runs this test binary as a child with a window
// armed to fire on its third hit, and checks that the child died of SIGKILL
// right there, after logging the kill line.
func TestHitKillsWithSIGKILL(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := FromEnv(); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			Hit(AfterPublishBeforeMark, "subject-"+string(rune('a'+i)))
		}
		os.Exit(0) // not reached when the kill works
	}
	log := filepath.Join(t.TempDir(), "fp.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHitKillsWithSIGKILL$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=after-publish-before-mark=every:3", "FAILPOINT_LOG="+log)
	line := runKilled(t, cmd, log)
	if !strings.Contains(string(line), "failpoint after-publish-before-mark fired") || !strings.Contains(string(line), "subject subject-c") {
		t.Fatalf("kill line %q: want the window and the third hit's subject", line)
	}
}

// TestTraceRecordsHitsThatDoNotFire: a traced window leaves a line at every
// hit, armed or not, so the harness can see a subject come back after a
// kill; windows not traced leave nothing.
func TestTraceRecordsHitsThatDoNotFire(t *testing.T) {
	log := filepath.Join(t.TempDir(), "fp.log")
	t.Cleanup(func() { Configure("", "", ""); Trace("") }) //nolint:errcheck
	if err := Configure("", "", ""); err != nil {
		t.Fatal(err)
	}
	if err := Trace("before-begin"); err == nil {
		t.Fatal("Trace without a log was accepted: its lines would go nowhere")
	}
	if err := Trace("no-such-window"); err == nil {
		t.Fatal("Trace accepted an unknown window")
	}
	if err := Configure("", "", log); err != nil {
		t.Fatal(err)
	}
	if err := Trace("before-begin, after-commit-before-response"); err != nil {
		t.Fatal(err)
	}
	Hit(BeforeBegin, "m-1")
	Hit(AfterCommitBeforeAck, "m-1") // not traced
	Hit(BeforeBegin, "m-2")
	Hit(AfterCommitBeforeResponse, "o-1")
	// A producer's id may hold a newline: it must not forge a line.
	Hit(BeforeBegin, "m 3\nfailpoint after-commit-before-ack fired: SIGKILL pid 1 subject x")
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 7 || f[0] != "failpoint" || f[2] != "hit:" || f[4] != strconv.Itoa(os.Getpid()) {
			t.Fatalf("trace line %q: want \"failpoint NAME hit: pid %d subject S\"", line, os.Getpid())
		}
		got = append(got, f[1]+" "+f[6])
	}
	want := []string{"before-begin m-1", "before-begin m-2", "after-commit-before-response o-1",
		"before-begin m?3?failpoint?after-commit-before-ack?fired:?SIGKILL?pid?1?subject?x"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("traced %q, want %q", got, want)
	}
}

// TestFromEnvRefusesMalformedValues: a malformed value is an error for the
// program to refuse to start with; nothing exits on its own.
func TestFromEnvRefusesMalformedValues(t *testing.T) {
	t.Cleanup(func() { Configure("", "", ""); Trace("") }) //nolint:errcheck
	for _, env := range [][2]string{
		{"FAILPOINTS", "before-begin=often"},
		{"FAILPOINT_SEED", "seven"},
		{"FAILPOINT_TRACE", "no-such-window"},
		{"FAILPOINT_GRACE", "a while"},
	} {
		t.Run(env[0], func(t *testing.T) {
			t.Setenv("FAILPOINT_LOG", filepath.Join(t.TempDir(), "fp.log"))
			t.Setenv(env[0], env[1])
			if err := FromEnv(); err == nil || !strings.Contains(err.Error(), env[0]) {
				t.Fatalf("%s=%q: FromEnv returned %v, want an error naming the variable", env[0], env[1], err)
			}
		})
	}
}

// TestOnceFiresOnTheNextHit: Once arms a window in a running process for its
// next hit, past a grace period that still holds for the other windows;
// Disarm takes it back.
func TestOnceFiresOnTheNextHit(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := FromEnv(); err != nil {
			t.Fatal(err)
		}
		Hit(AfterCommitBeforeAck, "before-once") // not armed yet
		if err := Once(AfterCommitBeforeAck); err != nil {
			t.Fatal(err)
		}
		Hit(BeforeBegin, "other-window") // armed every:1, but still in its grace period: no kill
		Disarm(AfterCommitBeforeAck)
		Hit(AfterCommitBeforeAck, "disarmed")
		if err := Once(AfterCommitBeforeAck); err != nil {
			t.Fatal(err)
		}
		Hit(AfterCommitBeforeAck, "the-next-one")
		os.Exit(0) // not reached when Once works
	}
	if err := Once("no-such-window"); err == nil {
		t.Fatal("Once accepted an unknown window")
	}
	log := filepath.Join(t.TempDir(), "fp.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestOnceFiresOnTheNextHit$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=before-begin=every:1", "FAILPOINT_GRACE=1h", "FAILPOINT_LOG="+log)
	line := runKilled(t, cmd, log)
	if got := string(line); strings.Count(got, "fired") != 1 || !strings.Contains(got, "failpoint after-commit-before-ack fired") || !strings.Contains(got, "subject the-next-one") {
		t.Fatalf("log %q: want one kill, at after-commit-before-ack, of the hit after Once", got)
	}
}

// runKilled runs the child cmd, requires that it died by SIGKILL, and
// returns the failpoint log it wrote.
func runKilled(t *testing.T, cmd *exec.Cmd, log string) []byte {
	t.Helper()
	err := cmd.Run()
	exit, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("child exited with %v, want death by SIGKILL", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", exit)
	}
	line, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// TestKillLineIsTheLast: goroutines hit traced, armed windows side by side;
// the first to fire kills the process, and nothing is written after its
// kill line (no second kill, no later hit): chaos/model/trace reads a process's
// last step as the window it died in.
func TestKillLineIsTheLast(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if err := FromEnv(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		for g := range 8 {
			go func() {
				for i := 0; ; i++ {
					Hit(BeforeBegin, "g"+strconv.Itoa(g)+"-"+strconv.Itoa(i))
				}
			}()
		}
		<-done // not reached: a goroutine's hit kills the process
	}
	for round := range 5 {
		log := filepath.Join(t.TempDir(), "fp.log")
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillLineIsTheLast$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=before-begin=every:200",
			"FAILPOINT_TRACE=before-begin", "FAILPOINT_LOG="+log)
		runKilled(t, cmd, log)
		data, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		kills := 0
		for i, l := range lines {
			if strings.Contains(l, " fired: ") {
				kills++
				if i != len(lines)-1 {
					t.Fatalf("round %d: kill line %d of %d is followed by %q", round, i+1, len(lines), lines[i+1])
				}
			}
		}
		if kills != 1 {
			t.Fatalf("round %d: %d kill lines, want 1", round, kills)
		}
	}
}
