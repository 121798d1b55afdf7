package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/gather"
)

// Batching. The router runs one handler call per partition at a time, so a
// consumer with many partitions has many deliveries in flight at once. With
// Config.BatchSize > 1, those that arrive together share one transaction, in
// one of two ways.
//
// Behind Middleware, the handler sees one message at a time, so the batch
// gives each message a savepoint:
//
//	BEGIN
//	  SAVEPOINT; INSERT inbox row; handler; RELEASE      -- message 1
//	  SAVEPOINT; INSERT inbox row; handler; ROLLBACK TO  -- message 2 failed: only its writes undone
//	  SAVEPOINT; INSERT inbox row (exists): duplicate; RELEASE
//	COMMIT                                               -- one WAL flush for the batch
//
// That saves commits but not statements. Behind Handler, the handler is a
// BatchFunc that takes the whole batch, so the statements are shared too:
//
//	BEGIN
//	  INSERT all inbox rows ON CONFLICT DO NOTHING RETURNING message_id  -- one statement
//	  BatchFunc(the messages whose rows were inserted)                   -- set-based writes
//	COMMIT
//
// If the BatchFunc fails, nothing of the batch commits and each half is
// tried again as a batch of its own, down to single messages, so the rest
// still commit in batches and a poison message fails by itself.
//
// Batches run only while Inbox.Run runs: it starts BatchWorkers goroutines,
// each running one batch transaction at a time on its own connection, and
// when its context ends it stops taking deliveries into batches (they go
// alone), lets the batches already taken commit, and returns.
//
// Either way, only after the COMMIT does any of the batch's middleware calls
// return, so every offset is still marked after its message's effects are
// durable. A message whose handler failed continues alone, through the retry
// path. A batch that fails as a whole (the connection dropped, the COMMIT
// failed) is not retried as a batch: each of its messages is tried again
// alone, so one message can never fail its companions twice.

// startBatches starts BatchWorkers batch workers and returns the function
// that stops them: it stops taking deliveries into batches and returns once
// the workers have run every batch already taken.
func (in *Inbox) startBatches() (stop func()) {
	q := gather.New[*batchItem](in.cfg.BatchSize, in.cfg.BatchSize*in.cfg.BatchWorkers, in.cfg.BatchLinger)
	var workers sync.WaitGroup
	for range in.cfg.BatchWorkers {
		workers.Go(func() { q.Run(in.runItems) })
	}
	in.batch.mu.Lock()
	in.batch.queue = q
	in.batch.mu.Unlock()
	return func() {
		in.batch.mu.Lock() // waits for Puts under way: the workers keep taking
		in.batch.queue = nil
		q.Close()
		in.batch.mu.Unlock()
		workers.Wait()
	}
}

// runItems runs one batch of deliveries and hands each delivery its result:
// the deliveries of every per-message applier (every Middleware) together,
// a savepoint each, and those of each set-based applier (each Handler) in
// a transaction of their own, one call of its BatchFunc.
func (in *Inbox) runItems(items []*batchItem) {
	groups := map[applier][]*batchItem{} // nil: every per-message applier's
	for _, it := range items {
		var key applier
		if it.a.setBased() {
			key = it.a
		}
		groups[key] = append(groups[key], it)
	}
	for a, group := range groups {
		var results []batchResult
		if a == nil {
			results = in.runSavepoints(group)
		} else {
			results = in.runSetBatchSplitting(a, group)
		}
		for i, it := range group {
			it.done <- results[i]
		}
	}
}

// inBatchTx runs apply in one transaction for items and commits it. apply
// runs the items the key policy lets the batch take (live: hold.go leaves
// a held key's to go alone) and fills in a result for each, or fails the
// batch: a batch that fails, or whose commit fails, sends every one of its
// items to be tried alone, and its error is returned beside the results.
// Like attempt, the transaction outlives no delivery's shutdown: it does not
// inherit cancellation, and it is bounded by TxTimeout.
func (in *Inbox) inBatchTx(items []*batchItem, apply func(ctx context.Context, tx pgx.Tx, live []int, results []batchResult) error) ([]batchResult, error) {
	results := make([]batchResult, len(items))
	ctx, cancel := in.txContext(items[0].d)
	defer cancel()
	err := func() error {
		tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		// hold.go: a held key's deliveries go alone.
		live, err := in.keys.batchable(ctx, tx, items, results)
		if err != nil {
			return err
		}
		if err := apply(ctx, tx, live, results); err != nil {
			return err
		}
		for i, it := range items { // the window of every message this commit applies
			if results[i].outcome == Applied {
				failpoint.Hit(failpoint.AfterHandlerBeforeCommit, it.d.id)
			}
		}
		ds := make([]*delivery, len(items))
		for i, it := range items {
			ds[i] = it.d
		}
		if err := in.markForStandbys(ctx, tx, ds...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	if err != nil {
		for i := range results {
			results[i] = batchResult{fallback: true}
		}
	}
	return results, err
}

// runSetBatchSplitting runs items as one set-based batch. When the handler
// fails the batch, it runs each half the same way, so that a poison message
// costs its companions about 2·log2(n) transactions instead of one each, and
// they still commit in batches. A batch of one that fails, or a batch that
// failed for another reason (the database, the commit), sends its items to
// be tried alone, where retries and dead letters are counted.
func (in *Inbox) runSetBatchSplitting(a applier, items []*batchItem) []batchResult {
	results, err := in.runSetBatch(a, items)
	var failed handlerFailed
	if len(items) < 2 || !errors.As(err, &failed) {
		return results
	}
	in.cfg.log.Debug("Inbox batch failed in the handler; splitting it in two", watermill.LogFields{
		"consumer": in.cfg.Consumer, "messages": len(items), "err": failed.Error()})
	half := len(items) / 2
	return append(in.runSetBatchSplitting(a, items[:half]), in.runSetBatchSplitting(a, items[half:])...)
}

// runSetBatch runs items through a set-based applier in one transaction and
// returns a result for each, and the batch's error if it failed.
func (in *Inbox) runSetBatch(a applier, items []*batchItem) ([]batchResult, error) {
	return in.inBatchTx(items, func(ctx context.Context, tx pgx.Tx, live []int, results []batchResult) error {
		fresh := make([]int, 0, len(live)) // indexes of items whose inbox row this batch inserted
		if in.cfg.disableDedupe {
			fresh = append(fresh, live...)
		} else {
			ds := make([]*delivery, len(live))
			for j, i := range live {
				ds[j] = items[i].d
			}
			inserted, err := in.insertRows(ctx, tx, ds, rowProcessed)
			if err != nil {
				return err
			}
			for _, j := range inserted {
				fresh = append(fresh, live[j])
			}
			for _, i := range live {
				it := items[i]
				if slices.Contains(fresh, i) {
					continue
				}
				o, reason, err := in.classifySeen(ctx, tx, it.d, "")
				if err != nil {
					return err
				}
				results[i] = batchResult{outcome: o, reason: reason}
			}
			for _, i := range fresh {
				failpoint.Hit(failpoint.AfterInboxInsert, items[i].d.id)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		msgs := make([]*message.Message, len(fresh))
		for j, i := range fresh {
			msgs[j] = items[i].d.msg
		}
		if err := a.apply(ctx, tx, msgs); err != nil {
			return handlerFailed{err} // split, down to the message it belongs to
		}
		for _, i := range fresh {
			results[i] = batchResult{outcome: Applied}
		}
		return nil
	})
}

// runSavepoints runs items, each through its own per-message applier, in
// one transaction, a savepoint each, and returns a result for each.
func (in *Inbox) runSavepoints(items []*batchItem) []batchResult {
	results, _ := in.inBatchTx(items, func(ctx context.Context, tx pgx.Tx, live []int, results []batchResult) error {
		deadline, _ := ctx.Deadline()
		for _, i := range live {
			it := items[i]
			// Each message keeps its own context (its trace span, its values),
			// without its cancellation, within the batch's deadline.
			ictx, cancel := context.WithDeadline(context.WithoutCancel(it.d.msg.Context()), deadline)
			res, err := in.savepoint(ictx, tx, it.a, it.d)
			cancel()
			if err != nil {
				return err // the transaction is gone: everyone alone
			}
			if tx.Conn().IsClosed() {
				return errors.New("inbox: connection closed during the batch")
			}
			results[i] = res
		}
		return nil
	})
	return results
}

// savepoint runs one delivery inside the batch transaction, in a savepoint.
// An error means the batch transaction itself is no longer usable.
func (in *Inbox) savepoint(ctx context.Context, tx pgx.Tx, a applier, d *delivery) (batchResult, error) {
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		return batchResult{}, err
	}
	if !in.cfg.disableDedupe {
		fresh, err := in.insertRows(ctx, sp, []*delivery{d}, rowProcessed)
		if err != nil {
			return batchResult{}, err
		}
		if len(fresh) == 0 {
			o, reason, err := in.classifySeen(ctx, sp, d, "")
			if err != nil {
				return batchResult{}, err
			}
			if err := sp.Commit(ctx); err != nil { // RELEASE
				return batchResult{}, err
			}
			return batchResult{outcome: o, reason: reason}, nil
		}
		failpoint.Hit(failpoint.AfterInboxInsert, d.id)
	}
	if herr := a.apply(ctx, sp, []*message.Message{d.msg}); herr != nil {
		if tx.Conn().IsClosed() {
			return batchResult{}, herr
		}
		if err := sp.Rollback(ctx); err != nil { // ROLLBACK TO SAVEPOINT
			return batchResult{}, err
		}
		if transient(tx, herr) {
			// A deadlock or serialization failure: not the message's fault,
			// so not an attempt; it is tried again alone.
			return batchResult{fallback: true}, nil
		}
		return batchResult{herr: herr}, nil
	}
	if err := sp.Commit(ctx); err != nil { // RELEASE: fails if the handler left it aborted
		if tx.Conn().IsClosed() {
			return batchResult{}, err
		}
		if rerr := sp.Rollback(ctx); rerr != nil {
			return batchResult{}, rerr
		}
		return batchResult{herr: fmt.Errorf("commit refused: %w", err)}, nil
	}
	return batchResult{outcome: Applied}, nil
}
