package outboxtest_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxtest"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// recorder is a testing.TB that records a failure instead of failing.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func fails(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != r {
				panic(p)
			}
		}()
		f(r)
	}()
	return r.failed
}

func TestRequirePublished(t *testing.T) {
	ctx := t.Context()
	pool := pg.TestDatabase(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	paid := outbox.NewMessage("order-1", []byte(`{"type": "OrderPaid"}`))
	other := outbox.NewMessage("order-2", []byte(`{"type": "OrderCaptured"}`))
	if err := outbox.PublishTx(ctx, tx, "orders.events", paid, other); err != nil {
		t.Fatal(err)
	}
	isPaid := func(m *message.Message) bool { return string(m.Payload) == `{"type": "OrderPaid"}` }

	// The transaction sees what it wrote; the pool does not, until commit.
	got := outboxtest.RequirePublished(t, tx, "orders.events", isPaid)
	if got.UUID != paid.UUID || got.Metadata.Get(outbox.KeyMetadata) != "order-1" {
		t.Errorf("got %s key %q, want %s key order-1", got.UUID, got.Metadata.Get(outbox.KeyMetadata), paid.UUID)
	}
	outboxtest.RequireNothingPublished(t, pool, "orders.events")
	outboxtest.RequireNothingPublished(t, tx, "inventory.events")

	// And it sees what it rules out: no match, two matches, a message where none may be.
	for name, f := range map[string]func(tb testing.TB){
		"no match":  func(tb testing.TB) { outboxtest.RequirePublished(tb, tx, "inventory.events", nil) },
		"two match": func(tb testing.TB) { outboxtest.RequirePublished(tb, tx, "orders.events", nil) },
		"a message": func(tb testing.TB) { outboxtest.RequireNothingPublished(tb, tx, "orders.events") },
	} {
		msg := fails(t, f)
		if msg == "" {
			t.Errorf("%s: passed", name)
		}
		t.Logf("%s: %s", name, msg)
	}
}
