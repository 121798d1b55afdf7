package judge_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/services/events"
)

// TestWrongAnswerOutcome: a wrong answer orders applied (InventoryReserved
// for an order inventory rejected) is handled once the auditor found the
// disagreement and repaired it, the order ending rejected and refunded; or
// when orders' guard refused it. Found and not repaired, repaired and the
// order not refunded, or not found at all, it is not. The order is held
// to that outcome, not to effects-have-causes, when the client names it
// injected; otherwise effects-have-causes sees the wrong answer.
func TestWrongAnswerOutcome(t *testing.T) {
	b := setup(t)
	auditDB := pg.TestDatabase(t)
	require.NoError(t, audit.Migrate(b.ctx, auditDB))
	id := b.createOrder(t, events.Line{SKU: "unstocked", Quantity: 1})
	b.pay(t, id)
	b.reject(t, id)
	b.settle(t, id, "reserved") // the wrong answer, applied
	msg := judge.HostileMessage{Class: "wrong_answer_signed", Consumer: "orders", ID: uuid.NewString(), Kind: judge.KindRefusedOrRepaired, Times: 1, Order: id}
	outcome := func() judge.HostileResult {
		t.Helper()
		r, err := judge.WrongAnswerOutcome(b.ctx, b.orders, auditDB, msg)
		require.NoError(t, err)
		return r
	}
	require.False(t, outcome().Handled, "applied and not found")
	b.exec(t, auditDB, `INSERT INTO audit_findings (check_name, entity, kind, detail) VALUES ('orders', $1, 'answers-disagree', 'orders says reserved')`, id)
	require.False(t, outcome().Handled, "found, not repaired")
	b.exec(t, auditDB, `UPDATE audit_findings SET repair = 'refund asked of orders', repaired_at = now()`)
	require.False(t, outcome().Handled, "repaired, the order still captured")
	b.exec(t, b.orders, `UPDATE orders SET status = 'rejected', payment = 'refunded' WHERE id = $1`, id)
	r := outcome()
	require.True(t, r.Handled, r.Reason)
	require.Contains(t, r.Reason, "repaired: refund asked of orders")
	// The auditor's record of its repair lost (its database restarted
	// between the call and the record; the recheck resolved the finding):
	// the order's reason says who asked. Without it, nobody did.
	b.exec(t, auditDB, `UPDATE audit_findings SET repair = NULL, repaired_at = NULL, resolved_at = now()`)
	require.False(t, outcome().Handled, "refunded, and nothing says the auditor asked")
	b.exec(t, b.orders, `UPDATE orders SET reject_reason = $2 WHERE id = $1`, id, "inventory rejected the order "+judge.RepairMark)
	r = outcome()
	require.True(t, r.Handled, r.Reason)
	require.Contains(t, r.Reason, "the auditor's record of it lost")

	refused := msg
	refused.ID, refused.Order = uuid.NewString(), b.reserved
	b.exec(t, b.orders, `INSERT INTO refusals (order_id, message_id, reason) VALUES ($1, $2, 'already settled')`, b.reserved, refused.ID)
	r, err := judge.WrongAnswerOutcome(b.ctx, b.orders, auditDB, refused)
	require.NoError(t, err)
	require.True(t, r.Handled, r.Reason)
	require.Equal(t, "refused: already settled", r.Reason)

	causes := func(c *judge.Client) judge.Invariant {
		t.Helper()
		rep, err := judge.Run(b.ctx, b.orders, b.inventory, nil, c)
		require.NoError(t, err)
		inv, ok := rep.Invariant(judge.EffectsHaveCauses)
		require.True(t, ok)
		return inv
	}
	require.False(t, causes(nil).OK, "the wrong answer applied is a breach")
	inj := causes(&judge.Client{Injected: []string{id}})
	require.True(t, inj.OK, inj.Detail)
}
