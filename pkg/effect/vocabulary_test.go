package effect_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// The three components run alike (docs/library.md, "One vocabulary for the
// three"): the compiler checks the lifecycle, ErrRunning and the admin
// verbs; TestOneVocabulary that each has Stats().
type lifecycle interface {
	Run(ctx context.Context) error
	Running() bool
}

var (
	_ lifecycle = (*outbox.Relay)(nil)
	_ lifecycle = (*inbox.Inbox)(nil)
	_ lifecycle = (*effect.Runner[struct{}])(nil)

	// The operator's List…, Get…, Retry…, Drop…, each with its Tx twin,
	// on an admin value of its own package; Read…Stats on a pool.
	_ = (*outboxadmin.Admin).ListParked
	_ = (*outboxadmin.Admin).Retry
	_ = (*outboxadmin.Admin).RetryTx
	_ = (*outboxadmin.Admin).Drop
	_ = (*outboxadmin.Admin).DropTx
	_ = (*inboxadmin.Admin).ListQuarantined
	_ = (*inboxadmin.Admin).GetQuarantined
	_ = (*inboxadmin.Admin).Retry
	_ = (*inboxadmin.Admin).RetryTx
	_ = (*inboxadmin.Admin).Drop
	_ = (*inboxadmin.Admin).DropTx
	_ = (*inboxadmin.Admin).ListHeld
	_ = (*inboxadmin.Admin).HoldStats
	_ = effect.ReadStats

	// A second Run while one runs returns the package's ErrRunning.
	_ = []error{outbox.ErrRunning, inbox.ErrRunning, effect.ErrRunning}
)

func TestOneVocabulary(t *testing.T) {
	for _, c := range []any{(*outbox.Relay)(nil), (*inbox.Inbox)(nil), (*effect.Runner[struct{}])(nil)} {
		m, ok := reflect.TypeOf(c).MethodByName("Stats")
		if !ok || m.Type.NumIn() != 1 || m.Type.NumOut() != 1 || m.Type.Out(0).Kind() != reflect.Struct {
			t.Errorf("%T: no Stats() returning its counters", c)
		}
	}
}
