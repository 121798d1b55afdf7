// Package inboxadmin is the operator's side of pkg/inbox, apart from the
// runtime: what the inbox quarantined (dead letters, payload conflicts,
// invalid messages), listed, inspected, retried and dropped, one at a time
// or in bulk with a dry run and a history; the keys a dead letter holds;
// failure groups; consumers that no longer run, retired; the continuity
// breaches a consumer recorded. A service that only consumes never imports
// it.
//
//	adm := inboxadmin.New(pool)
//	open, err := adm.ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: "inventory"})
//	// ... the handler fixed and deployed:
//	res, err := adm.Retry(ctx, open[0].ID, "alice") // written back through the outbox, applied once
//	// or, in the caller's transaction, recorded with what else it writes:
//	res, err = adm.RetryTx(ctx, tx, open[0].ID, "alice")
//
// Many at once: DryRun counts a Selection and pins it to the rows it
// chose; StartBulk, given that Plan, records the action; RunBulk does it in
// batches, resumable after a kill, each message once:
//
//	plan, err := adm.DryRun(ctx, inboxadmin.Selection{Consumer: "inventory", Group: groups[0].ID})
//	a, err := adm.StartBulk(ctx, inboxadmin.ActionRetry, plan, "alice", "fixed in v1.4.2")
//	a, err = adm.RunBulk(ctx, a.ID, inboxadmin.BulkOptions{})
//
// Every action of this package is in the history (ListActions), the
// single-message ones too. cmd/inboxctl and pkg/console are built on it.
package inboxadmin
