package inbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// everyConsumerWindow arms each of the inbox's crash windows to fire at its
// first hit.
const everyConsumerWindow = "before-begin=every:1,after-inbox-insert=every:1," +
	"after-handler-before-commit=every:1,after-commit-before-ack=every:1"

// TestFailpointsNeedTheBuildTag runs a program that imports pkg/inbox (this
// test binary, as a child) with every consumer window armed through the
// environment, and delivers one message through the inbox. A default build
// must ignore FAILPOINTS: the message is applied and the child exits 0. A
// build with -tags failpoint (make test runs this test in both builds) must
// die of SIGKILL in a window, so the test shows it can tell the two apart.
func TestFailpointsNeedTheBuildTag(t *testing.T) {
	if os.Getenv("INBOX_FAILPOINT_CHILD") == "1" {
		require.NoError(t, failpoint.FromEnv()) // what a program calls at start-up
		in, b := setup(t, inbox.Config{})
		id := newID()
		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), id, []byte(`{"amount":1}`)))
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
		t.Log("child: applied")
		return
	}
	t.Parallel()
	log := filepath.Join(t.TempDir(), "fp.log")
	cmd := exec.Command(os.Args[0], "-test.run=^TestFailpointsNeedTheBuildTag$", "-test.v")
	cmd.Env = append(os.Environ(), "INBOX_FAILPOINT_CHILD=1",
		"DATABASE_URL="+pg.URL("postgres"), // the child creates its database on this test's server
		"FAILPOINTS="+everyConsumerWindow, "FAILPOINT_LOG="+log)
	out, err := cmd.CombinedOutput()
	killLine, _ := os.ReadFile(log)

	if !failpoint.Enabled {
		require.NoError(t, err, "a default build was stopped with FAILPOINTS set:\n%s", out)
		require.Contains(t, string(out), "child: applied")
		require.Empty(t, killLine, "a default build wrote a failpoint line")
		return
	}
	exit, ok := err.(*exec.ExitError)
	require.True(t, ok, "a failpoint build ended with %v, want death by SIGKILL:\n%s", err, out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signal() == syscall.SIGKILL, "a failpoint build ended with %v, want SIGKILL", exit)
	require.True(t, strings.Contains(string(killLine), "failpoint before-begin fired"), "kill line %q", killLine)
}
