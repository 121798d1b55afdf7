// Package audit checks a running system's invariants continuously, the way
// a test checks them after a run: every entity (an order, a sale, a SKU)
// is examined once it has settled, and again while something about it is
// wrong, so a breach is found within a round of it settling, and a finding
// that was only late resolves itself.
//
//	orders := audit.Entities("orders-answered",
//		func(ctx context.Context, from audit.Mark, grace time.Duration, limit int) ([]audit.Entity, error) {
//			return paidBefore(ctx, from, time.Now().Add(-grace), limit) // settled orders past the mark, in (time, key) order
//		},
//		func(ctx context.Context, ids []string) ([]audit.Finding, error) {
//			return unanswered(ctx, ids) // a Finding{Entity: id, Kind: "unanswered", Detail: ...} for each that is wrong
//		})
//	auditor, err := audit.New(state, audit.Config{Grace: time.Minute}, orders)
//	g.Go(func() error { return auditor.Run(ctx) }) // a round every Interval; findings in audit_findings
//
// What it promises:
//
//   - Nothing settled is skipped, given a scan that never passes an entity
//     a transaction still open may commit behind it. Each check reads the
//     entities past its watermark in its own order, at most a batch at a
//     time, only those older than Config.Grace (work still in flight is
//     never a finding), and the watermark moves in the same transaction
//     that records the batch's findings: a killed auditor resumes where the
//     last committed batch ended, and examines a batch again at worst.
//     Rows become visible in commit order, not in the order of their
//     times or ids: a scan keyed on a row's now() (its transaction's start)
//     must stop before the oldest transaction still open on its database
//     (services/auditor's scans do), or a slow writer's row is passed.
//   - A round costs what arrived since the last one: the watermark is a
//     keyset position, so a check reads new rows by an index, whatever the
//     size of the tables behind it (a check keeps a running total, such as
//     a stock ledger, in the auditor's own tables, in the same
//     transaction).
//   - One row per breach: a finding is (check, entity, kind), seen again at
//     each recheck until the check no longer returns it, then resolved;
//     one that comes back is opened again. audit_findings holds them with
//     first and last seen, for the metrics (ReadStatus) and an operator
//     (ListFindings).
//
// The checks are the program's: what is wrong in an order service is not
// this package's to know. Entities makes the usual one from two functions
// (list what settled past the watermark; examine some entities); Check
// takes any scan. An Auditor runs them in rounds (Round, Run); replicas may
// run side by side, each batch holding its check's watermark row locked.
package audit
