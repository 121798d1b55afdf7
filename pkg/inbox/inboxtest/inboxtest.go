// Package inboxtest helps a service's own tests hold its handlers to the
// inbox's promise: a message's database writes are applied once, however
// often Kafka delivers it. No broker is needed: the handler is called as
// the router calls it, through the inbox's middleware, on a real Postgres.
//
//	cfg := inbox.Config{Pool: pool, Consumer: "billing"}
//	inboxtest.RequireOnce(t, cfg, credit, inboxtest.Message(`{"amount": 100}`),
//		func() int { return countRows(t, pool, "credits") })
package inboxtest

import (
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// Message is a message with a fresh id and payload, as a producer's outbox
// would send it.
func Message(payload string) *message.Message {
	return message.NewMessage(watermill.NewUUID(), []byte(payload))
}

// RequireOnce delivers msg twice to handler behind an Inbox made from cfg,
// as Kafka does when a consumer dies after its transaction commits and
// before its offset does, and fails t unless the first delivery was applied,
// the second suppressed as a duplicate, and effect (a count of what handler
// writes, read from the database) rose by exactly one over the two. Each
// delivery is a copy of msg: its id, payload and metadata. It returns the
// outcomes the Inbox settled the deliveries with (a failed attempt the
// inbox retried, Retried, is not one); cfg's OnOutcome, if set, still sees
// every event.
//
// The Inbox is cfg's own: its MessageID, Key and Verify apply. So clear
// Verify, or sign msg as its producer would (pkg/signature), or the
// deliveries are quarantined as invalid; and a key an earlier test's dead
// letter holds (OnDeadLetter HoldKey, same database) parks them.
func RequireOnce(t testing.TB, cfg inbox.Config, handler message.HandlerFunc, msg *message.Message, effect func() int) []inbox.Outcome {
	t.Helper()
	var (
		mu       sync.Mutex
		outcomes []inbox.Outcome
	)
	user := cfg.OnOutcome
	cfg.OnOutcome = func(e inbox.Event) {
		if e.Outcome != inbox.Retried { // the Inbox is this call's: every event is msg's
			mu.Lock()
			outcomes = append(outcomes, e.Outcome)
			mu.Unlock()
		}
		if user != nil {
			user(e)
		}
	}
	in, err := inbox.New(cfg)
	if err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	h := in.Middleware(handler)
	before := effect()
	for i := range 2 {
		delivery := msg.Copy()
		delivery.SetContext(msg.Context())
		if _, err := h(delivery); err != nil {
			t.Fatalf("inboxtest: delivery %d of message %s: %v", i+1, msg.UUID, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(outcomes) != 2 || outcomes[0] != inbox.Applied || outcomes[1] != inbox.Duplicate {
		t.Errorf("inboxtest: message %s delivered twice settled as %v, want [%s %s]", msg.UUID, outcomes, inbox.Applied, inbox.Duplicate)
	}
	if got := effect() - before; got != 1 {
		t.Errorf("inboxtest: message %s delivered twice changed the effect by %d, want 1", msg.UUID, got)
	}
	return outcomes
}
