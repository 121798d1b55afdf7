//go:build failpoint

package inboxtest_test

import (
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxtest"
)

// TestRequireOnceWithoutDedupe: the control. With deduplication off (a
// failpoint build's inbox.WithoutDedupe, the chaos proof's control) the
// second delivery applies the message again, and RequireOnce must say so.
func TestRequireOnceWithoutDedupe(t *testing.T) {
	pool, credit, count := wallet(t)
	cfg := inbox.WithoutDedupe(inbox.Config{Pool: pool, Consumer: "wallet"})
	r := run(t, func(tb testing.TB) { inboxtest.RequireOnce(tb, cfg, credit, inboxtest.Message("100"), count) })
	if len(r.errors) == 0 {
		t.Fatal("RequireOnce passed with deduplication off")
	}
	t.Logf("without dedupe: %v", r.errors)
}
