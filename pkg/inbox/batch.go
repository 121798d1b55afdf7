package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
// If the BatchFunc fails, nothing of the batch commits and each message is
// tried again alone, a batch of one, so a poison message fails by itself.
//
// Either way, only after the COMMIT does any of the batch's middleware calls
// return, so every offset is still marked after its message's effects are
// durable. A message whose handler failed continues alone, through the retry
// path. A batch that fails as a whole (the connection dropped, the COMMIT
// failed) is not retried as a batch: each of its messages is tried again
// alone, so one message can never fail its companions twice.

// BatchFunc applies msgs in tx, the inbox's transaction, and must neither
// commit nor roll it back. Every message in msgs is new to the consumer: the
// inbox has already recorded it and filtered out duplicates. An error fails
// the whole batch; the inbox then calls the BatchFunc again with each message
// alone, so the error is pinned on the message that causes it (wrap it with
// Permanent to dead-letter that message at once). ctx carries the batch's
// deadline; each message keeps its own context.
type BatchFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error

// setHandler is one BatchFunc registered with Handler. Deliveries are only
// batched with others of the same setHandler.
type setHandler struct{ fn BatchFunc }

// Handler returns a Watermill handler that applies each message at most once
// per consumer, like Middleware, through fn: up to Config.BatchSize
// deliveries that arrive together are applied by one call of fn, in one
// transaction. With BatchSize 1, fn sees one message per transaction.
func (in *Inbox) Handler(fn BatchFunc) message.NoPublishHandlerFunc {
	set := &setHandler{fn: fn}
	one := func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		return nil, fn(ctx, Tx(ctx), []*message.Message{msg})
	}
	h := in.handler(one, set)
	return func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}
}

// batchItem is one delivery waiting for a batch.
type batchItem struct {
	d    *delivery
	h    message.HandlerFunc
	set  *setHandler // nil: batched with savepoints
	done chan batchResult
}

// batchResult is what the batch did with one delivery.
type batchResult struct {
	outcome  Outcome // Applied, Duplicate or Conflict: committed with the batch
	reason   string
	herr     error // the handler failed; its savepoint was rolled back
	fallback bool  // the batch failed as a whole: try the delivery alone
}

// batcher feeds deliveries to BatchWorkers goroutines, each running one
// batch transaction at a time on its own connection (internal/gather).
type batcher struct {
	once  sync.Once
	queue *gather.Queue[*batchItem]
}

// viaBatch runs the first attempt of d in a batch. It returns like attempt.
func (in *Inbox) viaBatch(d *delivery, h message.HandlerFunc, set *setHandler) (out []*message.Message, herr, err error) {
	in.batch.once.Do(func() {
		in.batch.queue = gather.New[*batchItem](in.cfg.BatchSize, in.cfg.BatchSize*in.cfg.BatchWorkers, in.cfg.BatchLinger)
		for range in.cfg.BatchWorkers {
			go in.batch.queue.Run(in.runItems)
		}
	})
	item := &batchItem{d: d, h: h, set: set, done: make(chan batchResult, 1)}
	in.batch.queue.Put(context.Background(), item)
	res := <-item.done
	in.batch.queue.Done()
	switch {
	case res.fallback:
		return in.attempt(d, h)
	case res.herr != nil:
		return nil, res.herr, nil
	case res.outcome == Applied:
		in.settle(d, Applied, "")
	default:
		in.settleSeen(d, res.outcome, res.reason)
	}
	return nil, nil, nil
}

// runItems runs one batch of deliveries, as one transaction per kind of
// handler, and hands each delivery its result.
func (in *Inbox) runItems(items []*batchItem) {
	groups := map[*setHandler][]*batchItem{}
	for _, it := range items {
		groups[it.set] = append(groups[it.set], it)
	}
	for set, group := range groups {
		var results []batchResult
		if set == nil {
			results = in.runBatch(group)
		} else {
			results = in.runSetBatchSplitting(set, group)
		}
		for i, it := range group {
			it.done <- results[i]
		}
	}
}

// inBatchTx runs apply in one transaction for items and commits it. apply
// fills in a result for each item, or fails the batch: a batch that fails,
// or whose commit fails, sends every one of its items to be tried alone, and
// its error is returned beside the results.
// Like attempt, the transaction outlives no delivery's shutdown: it does not
// inherit cancellation, and it is bounded by TxTimeout.
func (in *Inbox) inBatchTx(items []*batchItem, apply func(ctx context.Context, tx pgx.Tx, results []batchResult) error) ([]batchResult, error) {
	results := make([]batchResult, len(items))
	ctx, cancel := in.txContext(items[0].d)
	defer cancel()
	err := func() error {
		tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		if err := apply(ctx, tx, results); err != nil {
			return err
		}
		failpoint.Hit(failpoint.AfterHandlerBeforeCommit, items[0].d.id)
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
func (in *Inbox) runSetBatchSplitting(set *setHandler, items []*batchItem) []batchResult {
	results, err := in.runSetBatch(set, items)
	var failed handlerFailed
	if len(items) < 2 || !errors.As(err, &failed) {
		return results
	}
	in.cfg.Logger.Debug("Inbox batch failed in the handler; splitting it in two", watermill.LogFields{
		"consumer": in.cfg.Consumer, "messages": len(items), "err": failed.Error()})
	half := len(items) / 2
	return append(in.runSetBatchSplitting(set, items[:half]), in.runSetBatchSplitting(set, items[half:])...)
}

// handlerFailed is a set-based batch's error when its BatchFunc failed it.
type handlerFailed struct{ err error }

func (h handlerFailed) Error() string { return h.err.Error() }
func (h handlerFailed) Unwrap() error { return h.err }

// runSetBatch runs items through set's BatchFunc in one transaction and
// returns a result for each, and the batch's error if it failed.
func (in *Inbox) runSetBatch(set *setHandler, items []*batchItem) ([]batchResult, error) {
	return in.inBatchTx(items, func(ctx context.Context, tx pgx.Tx, results []batchResult) error {
		fresh := make([]int, 0, len(items)) // indexes of items whose inbox row this batch inserted
		if in.cfg.DisableDedupe {
			for i := range items {
				fresh = append(fresh, i)
			}
		} else {
			var err error
			if fresh, err = in.insertRows(ctx, tx, items); err != nil {
				return err
			}
			for i, it := range items {
				if slices.Contains(fresh, i) {
					continue
				}
				o, reason, err := in.classifySeen(ctx, tx, it.d, "")
				if err != nil {
					return err
				}
				results[i] = batchResult{outcome: o, reason: reason}
			}
			if len(fresh) > 0 {
				failpoint.Hit(failpoint.AfterInboxInsert, items[fresh[0]].d.id)
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		msgs := make([]*message.Message, len(fresh))
		for j, i := range fresh {
			msgs[j] = items[i].d.msg
		}
		if err := callBatch(ctx, set.fn, tx, msgs); err != nil {
			return handlerFailed{err} // split, down to the message it belongs to
		}
		for _, i := range fresh {
			results[i] = batchResult{outcome: Applied}
		}
		return nil
	})
}

// insertRows inserts the inbox rows of items in one statement and returns the
// indexes of the items whose row it inserted: the others were seen before.
// Rows go in in id order, so two batches that share ids wait for each other
// instead of deadlocking. When one id comes twice in the batch, its first
// delivery is the fresh one.
func (in *Inbox) insertRows(ctx context.Context, tx pgx.Tx, items []*batchItem) ([]int, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(items[a].d.id, items[b].d.id) })
	ids := make([]string, len(items))
	sums := make([][]byte, len(items))
	topics := make([]string, len(items))
	parts := make([]*int32, len(items))
	offsets := make([]*int64, len(items))
	for j, i := range order {
		ids[j], sums[j], topics[j] = items[i].d.id, items[i].d.sum[:], items[i].d.topic
		parts[j], offsets[j] = items[i].d.part, items[i].d.offset
	}
	rows, err := tx.Query(ctx, `
		INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, kafka_partition, kafka_offset)
		SELECT $1, u.id, u.sum, u.topic, u.part, u.off
		FROM unnest($2::text[], $3::bytea[], $4::text[], $5::int[], $6::bigint[]) AS u(id, sum, topic, part, off)
		ON CONFLICT DO NOTHING
		RETURNING message_id`, in.cfg.Consumer, ids, sums, topics, parts, offsets)
	if err != nil {
		return nil, fmt.Errorf("inbox: inserting inbox rows: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: inserting inbox rows: %w", err)
	}
	var fresh []int
	for _, i := range order {
		if k := slices.Index(inserted, items[i].d.id); k >= 0 {
			inserted = slices.Delete(inserted, k, k+1) // a second delivery of the id is not fresh
			fresh = append(fresh, i)
		}
	}
	slices.Sort(fresh)
	return fresh, nil
}

// callBatch runs fn and turns a panic into an error.
func callBatch(ctx context.Context, fn BatchFunc, tx pgx.Tx, msgs []*message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return fn(ctx, tx, msgs)
}

// runBatch runs items in one transaction, a savepoint each, and returns a
// result for each.
func (in *Inbox) runBatch(items []*batchItem) []batchResult {
	results, _ := in.inBatchTx(items, func(ctx context.Context, tx pgx.Tx, results []batchResult) error {
		deadline, _ := ctx.Deadline()
		for i, it := range items {
			// Each message keeps its own context (its trace span, its values),
			// without its cancellation, within the batch's deadline.
			ictx, cancel := context.WithDeadline(context.WithoutCancel(it.d.msg.Context()), deadline)
			res, err := in.batchOne(ictx, tx, it)
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

// batchOne runs one delivery inside the batch transaction, in a savepoint.
// An error means the batch transaction itself is no longer usable.
func (in *Inbox) batchOne(ctx context.Context, tx pgx.Tx, it *batchItem) (batchResult, error) {
	d := it.d
	sp, err := tx.Begin(ctx) // SAVEPOINT
	if err != nil {
		return batchResult{}, err
	}
	if !in.cfg.DisableDedupe {
		tag, err := sp.Exec(ctx, `
			INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, kafka_partition, kafka_offset)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT DO NOTHING`, in.cfg.Consumer, d.id, d.sum[:], d.topic, d.part, d.offset)
		if err != nil {
			return batchResult{}, fmt.Errorf("inbox: inserting inbox row: %w", err)
		}
		if tag.RowsAffected() == 0 {
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
	out, herr := callHandler(it.h, d.msg, context.WithValue(ctx, txKey{}, sp))
	if herr == nil && len(out) > 0 {
		herr = Permanent(errors.New("the handler returned messages; write them with outbox.PublishTx on the inbox transaction instead"))
	}
	if herr != nil {
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
