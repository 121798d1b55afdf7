package judge

import "github.com/outboxref/outbox-inbox/pkg/failpoint"

// Window is what the test bed knows of one crash window: which service a
// kill there stops, what is true at that moment, why the outcome is still
// exactly once, and the line the chaos report's window table gives it. The
// live demo's lesson (dashboard/crashnow), chaos -scenario and the report all
// tell a window's story from here.
type Window struct {
	Victim string // the service a kill in the window stops
	Before string // what is true at the moment of the kill
	Why    string // why nothing was applied twice
	Note   string // the report's line for a subject somebody consumes
	// Unconsumed is the report's line for a message nobody consumes (a
	// dead letter, a probe message): its copies in Kafka are all there is
	// to measure. Empty where the window has no such subjects.
	Unconsumed string
}

// Windows are the crash windows, each with its story.
var Windows = map[failpoint.Name]Window{
	failpoint.BeforeBegin: {
		Victim: "inventory",
		Before: "inventory had received OrderPaid from Kafka but had not opened a transaction: nothing was written.",
		Why:    "Kafka never saw the offset committed, so it delivered OrderPaid again to the restarted inventory. The inbox had no row for it, so it was applied now, once.",
		Note:   "nothing written; redelivered, applied once",
	},
	failpoint.AfterInboxInsert: {
		Victim: "inventory",
		Before: "inventory had inserted the inbox row, inside a transaction that never committed.",
		Why:    "An uncommitted insert dies with its connection: Postgres rolled it back. Kafka redelivered OrderPaid, the inbox had no row, and it was applied once.",
		Note:   "inbox row rolled back with the connection; redelivered, applied once",
	},
	failpoint.AfterHandlerBeforeCommit: {
		Victim: "inventory",
		Before: "inventory had reserved the stock and written InventoryReserved to its outbox, all in one uncommitted transaction.",
		Why:    "The reservation, the outbox row and the inbox row were one transaction: all rolled back together. The redelivery applied them, once.",
		Note:   "domain writes rolled back; redelivered, applied once",
	},
	failpoint.AfterCommitBeforeAck: {
		Victim: "inventory",
		Before: "inventory had COMMITTED the inbox row, the reservation and the InventoryReserved outbox row, but Kafka's committed offset was still before the message.",
		Why:    "Kafka redelivered OrderPaid, as at-least-once delivery must. The inbox INSERT hit the committed row (ON CONFLICT DO NOTHING, zero rows), the payload hash matched, so the handler was skipped and the message acknowledged: a suppressed duplicate, not a second reservation.",
		Note:   "committed, offset not: the copy meets the effect",
	},
	failpoint.AfterClaimBeforePublish: {
		Victim:     "orders",
		Before:     "the orders relay had locked the OrderPaid row (FOR UPDATE SKIP LOCKED) but sent nothing to Kafka.",
		Why:        "The relay's transaction died with its connection, so the lock went with it and the row stayed unpublished. The restarted relay claimed and published it: inventory received it once.",
		Note:       "claimed, not sent: the next relay sent it (copies in Kafka ≥ 1)",
		Unconsumed: "claimed, not sent: the next relay sent it (copies in Kafka ≥ 1); nobody consumes it",
	},
	failpoint.AfterPublishBeforeMark: {
		Victim:     "orders",
		Before:     "Kafka had acknowledged OrderPaid, but the orders relay had not marked the row published.",
		Why:        "The restarted relay found the row unmarked and published it again: Kafka now holds two copies with the same message id. Inventory's inbox applied the first and suppressed the second.",
		Note:       "sent, not marked: sent again (copies in Kafka ≥ 2), the copy meets the effect",
		Unconsumed: "sent, not marked: sent again (copies in Kafka ≥ 2); nobody consumes it",
	},
	failpoint.AfterCommitBeforeResponse: {
		Victim: "orders",
		Before: "orders had COMMITTED status=paid and the OrderPaid outbox row, but the client got no HTTP answer.",
		Why:    "The client retried the payment. The order was no longer 'created', so the UPDATE matched nothing and no second OrderPaid was written: the status transition is the idempotency key.",
		Note:   "paid, no answer: the client retried, got the paid order; OrderPaid rows = applied",
	},
	failpoint.BeforeEffect: {
		Victim: "orders",
		Before: "orders had COMMITTED the reservation with the intent to capture the payment (an effects row, capture-<order id>), and had claimed it, but had not called the provider.",
		Why:    "The claim only moved the effect's due time past its lease. When the lease ran out, the restarted orders claimed it again and called the provider with the same Idempotency-Key: the provider captured it, once, because nothing had been captured before.",
		Note:   "capture intent committed, not called: called again after the lease; ledger attempts = applied",
	},
	failpoint.AfterEffectBeforeRecord: {
		Victim: "orders",
		Before: "the provider had CAPTURED the payment and answered, but orders had not committed the outcome: the effect was still pending, the order still 'capturing'.",
		Why:    "After the lease the restarted orders called the provider again with the same Idempotency-Key. The provider found the key completed and answered with the stored response (Idempotent-Replayed: true) instead of capturing again: one capture in its ledger, recorded once on the order.",
		Note:   "captured, not recorded: called again with its key, the provider replays (suppressed = replays)",
	},
}

// EffectWindow reports whether w is one of pkg/effect's windows.
func EffectWindow(w failpoint.Name) bool {
	return w == failpoint.BeforeEffect || w == failpoint.AfterEffectBeforeRecord
}

// ConsumerWindow reports whether w is one of the inbox's windows.
func ConsumerWindow(w failpoint.Name) bool {
	switch w {
	case failpoint.BeforeBegin, failpoint.AfterInboxInsert, failpoint.AfterHandlerBeforeCommit, failpoint.AfterCommitBeforeAck:
		return true
	}
	return false
}

// CommittedBeforeKill reports whether a kill in w leaves the effect
// committed, so a copy that comes back meets it.
func CommittedBeforeKill(w failpoint.Name) bool {
	return w == failpoint.AfterCommitBeforeAck || w == failpoint.AfterPublishBeforeMark || w == failpoint.AfterEffectBeforeRecord
}
