package inboxtest_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxtest"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// wallet is a database with the inbox's tables and a credits table, and
// a handler that writes one credit per message through the inbox's
// transaction.
func wallet(t *testing.T) (*pgxpool.Pool, message.HandlerFunc, func() int) {
	t.Helper()
	pool := pg.TestDatabase(t)
	ctx := t.Context()
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE credits (amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	credit := func(msg *message.Message) ([]*message.Message, error) {
		amount, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return nil, inbox.Permanent(err)
		}
		_, err = inbox.Tx(msg.Context()).Exec(msg.Context(), `INSERT INTO credits VALUES ($1)`, amount)
		return nil, err
	}
	count := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM credits`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return pool, credit, count
}

func TestRequireOnce(t *testing.T) {
	pool, credit, count := wallet(t)
	var seen []inbox.Outcome
	cfg := inbox.Config{Pool: pool, Consumer: "wallet", OnOutcome: func(e inbox.Event) { seen = append(seen, e.Outcome) }}
	got := inboxtest.RequireOnce(t, cfg, credit, inboxtest.Message("100"), count)
	if fmt.Sprint(got) != "[applied duplicate]" || fmt.Sprint(seen) != "[applied duplicate]" {
		t.Errorf("outcomes %v, the config's own callback saw %v", got, seen)
	}
}

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errors []string
	fatal  bool
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.fatal = true
	panic(r)
}

// run calls f with a recorder and returns what it recorded.
func run(t *testing.T, f func(tb testing.TB)) (r *recorder) {
	r = &recorder{TB: t}
	defer func() {
		if p := recover(); p != nil && p != r {
			panic(p)
		}
	}()
	f(r)
	return r
}

// The helper sees what it rules out: a handler that writes nothing, one
// that writes twice per message, and one that fails.
func TestRequireOnceSeesFailures(t *testing.T) {
	pool, credit, count := wallet(t)
	cfg := inbox.Config{Pool: pool, Consumer: "wallet", MaxAttempts: 1, RetryBackoff: time.Millisecond}
	nothing := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	twice := func(msg *message.Message) ([]*message.Message, error) {
		if _, err := credit(msg); err != nil {
			return nil, err
		}
		return credit(msg)
	}
	for name, h := range map[string]message.HandlerFunc{"writes nothing": nothing, "writes twice": twice} {
		r := run(t, func(tb testing.TB) { inboxtest.RequireOnce(tb, cfg, h, inboxtest.Message("5"), count) })
		if len(r.errors) == 0 {
			t.Errorf("%s: RequireOnce passed", name)
		}
		t.Logf("%s: %v", name, r.errors)
	}
	r := run(t, func(tb testing.TB) { inboxtest.RequireOnce(tb, cfg, credit, inboxtest.Message("not a number"), count) })
	if len(r.errors) == 0 {
		t.Error("a message the handler refuses: RequireOnce passed")
	}
	t.Logf("refused: %v", r.errors)
}

// The inbox's own settings apply: an id taken from metadata, and a handler
// that fails once and is retried (the retry is not an outcome).
func TestRequireOnceWithTheConfigsOwnIDAndARetry(t *testing.T) {
	pool, credit, count := wallet(t)
	failed := false
	flaky := func(msg *message.Message) ([]*message.Message, error) {
		if !failed {
			failed = true
			return nil, fmt.Errorf("a transient failure")
		}
		return credit(msg)
	}
	msg := inboxtest.Message("7")
	msg.Metadata.Set("event_id", "0194a0b0-0000-7000-8000-000000000001")
	cfg := inbox.Config{Pool: pool, Consumer: "wallet", MessageID: inbox.FromMetadata("event_id"), RetryBackoff: time.Millisecond}
	got := inboxtest.RequireOnce(t, cfg, flaky, msg, count)
	if fmt.Sprint(got) != "[applied duplicate]" || !failed {
		t.Errorf("outcomes %v (failed once: %v)", got, failed)
	}
}
