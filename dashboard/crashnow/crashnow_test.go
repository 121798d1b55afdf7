package crashnow

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// TestReadingTheLog: a lesson reads the kill of the process it armed, in
// the window it armed, not the last kill of any process; and counts the
// deliveries of one message, of one process when asked, after an offset.
func TestReadingTheLog(t *testing.T) {
	log := filepath.Join(t.TempDir(), "fp.log")
	before := "failpoint after-commit-before-ack fired: SIGKILL pid 222 subject old\n"
	lines := before +
		"failpoint before-begin hit: pid 222 subject m1\n" +
		"failpoint after-commit-before-ack fired: SIGKILL pid 222 subject m1\n" +
		"failpoint after-claim-before-publish fired: SIGKILL pid 111 subject m9\n" +
		"failpoint before-begin hit: pid 333 subject m1\n" +
		"failpoint before-begin hit: pid 333 subject m10\n" +
		"failpoint before-begin hit: pid 444 subject m1\n" +
		"failpoint before-begin hit: pid 333 subject m1" // no newline yet: a line being written
	if err := os.WriteFile(log, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := int64(len(before))
	k, ok := findKill(log, mark, failpoint.AfterCommitBeforeAck, 222)
	if !ok || k.subject != "m1" || k.pid != 222 {
		t.Fatalf("findKill = %+v, %v; want pid 222's kill of m1 after the mark, not the older one or pid 111's", k, ok)
	}
	if _, ok := findKill(log, mark, failpoint.AfterCommitBeforeAck, 111); ok {
		t.Fatal("findKill took pid 111's kill in another window")
	}
	if n := deliveries(log, k.end, "m1", 0); n != 2 {
		t.Fatalf("deliveries of m1 after the kill = %d, want 2 (whole lines only, not m10)", n)
	}
	if n := deliveries(log, k.end, "m1", 333); n != 1 {
		t.Fatalf("deliveries of m1 to pid 333 = %d, want 1", n)
	}
}
