package examples_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestExamples runs each example as a learner would (built, then started
// with no setup beyond what the test run gives every package) and checks
// what it prints, line by line: the README and the docs quote it.
func TestExamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dir  string
		args []string
		want string
	}{
		{"killed-after-commit", []string{"-kill"}, `orders: order-1 paid; OrderPaid written to the outbox in the same transaction
inventory: OrderPaid order-1: applied (stock reserved and the inbox row written, in one transaction)
inventory: committed, not acked: SIGKILL
machine: the services died (SIGKILL); starting them again
inventory: OrderPaid order-1: duplicate (the inbox row is there: the handler did not run)

The three rows, in the services' database:
  domain  orders:          order-1 paid
  outbox  outbox_messages: OrderPaid order-1, published at HH:MM:SS
  inbox   inbox_messages:  inventory processed, copies suppressed: 1
  and the effect once:     stock of book reserved 1
`},
		{"killed-after-commit", nil, `orders: order-1 paid; OrderPaid written to the outbox in the same transaction
inventory: OrderPaid order-1: applied (stock reserved and the inbox row written, in one transaction)

The three rows, in the services' database:
  domain  orders:          order-1 paid
  outbox  outbox_messages: OrderPaid order-1, published at HH:MM:SS
  inbox   inbox_messages:  inventory processed, copies suppressed: 0
  and the effect once:     stock of book reserved 1
`},
		{"plain-client", nil, `offset 0: applied, offset committed; stock reserved: 1
offset 1: duplicate, offset committed; stock reserved: 1
`},
	} {
		t.Run(strings.Join(append([]string{c.dir}, c.args...), " "), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			bin := filepath.Join(t.TempDir(), c.dir)
			if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./"+c.dir).CombinedOutput(); err != nil {
				t.Fatalf("go build ./%s: %v\n%s", c.dir, err, out)
			}
			cmd := exec.CommandContext(ctx, bin, c.args...)
			cmd.Env = withoutServers(os.Environ()) // as a learner runs it: everything embedded
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", c.dir, c.args, err, out, stderr.String())
			}
			got := clock.ReplaceAllString(string(out), "HH:MM:SS")
			if got != c.want {
				t.Errorf("%s %v printed\n%s\nwant\n%s", c.dir, c.args, got, c.want)
			}
		})
	}
}

var clock = regexp.MustCompile(`\d\d:\d\d:\d\d`)

// withoutServers is env without DATABASE_URL and KAFKA_BROKERS, so the
// example starts its own Postgres and broker.
func withoutServers(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "DATABASE_URL=") && !strings.HasPrefix(e, "KAFKA_BROKERS=") {
			out = append(out, e)
		}
	}
	return out
}
