package failpoint

import (
	"os"
	"os/exec"
	"path/filepath"
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
		for i := range 5 {
			Hit(AfterPublishBeforeMark, "subject-"+string(rune('a'+i)))
		}
		os.Exit(0) // not reached when the kill works
	}
	log := filepath.Join(t.TempDir(), "fp.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHitKillsWithSIGKILL$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=after-publish-before-mark=every:3", "FAILPOINT_LOG="+log)
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
	if !strings.Contains(string(line), "failpoint after-publish-before-mark fired") || !strings.Contains(string(line), "subject subject-c") {
		t.Fatalf("kill line %q: want the window and the third hit's subject", line)
	}
}
