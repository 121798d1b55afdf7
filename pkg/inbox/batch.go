package inbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// Batching. The router runs one handler call per partition at a time, so a
// consumer with many partitions has many deliveries in flight at once. With
// Config.BatchSize > 1, those that arrive together share one transaction,
// one savepoint each:
//
//	BEGIN
//	  SAVEPOINT; INSERT inbox row; handler; RELEASE      -- message 1
//	  SAVEPOINT; INSERT inbox row; handler; ROLLBACK TO  -- message 2 failed: only its writes undone
//	  SAVEPOINT; INSERT inbox row (exists): duplicate; RELEASE
//	COMMIT                                               -- one WAL flush for the batch
//
// and only after that COMMIT does any of their middleware calls return, so
// every offset is still marked after its message's effects are durable. A
// message whose handler failed continues alone, through the retry path. A
// batch that fails as a whole (the connection dropped, the COMMIT failed) is
// not retried as a batch: each of its messages is tried again alone, so one
// message can never fail its companions twice.

// batchItem is one delivery waiting for a batch.
type batchItem struct {
	d    *delivery
	h    message.HandlerFunc
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
// batch transaction at a time on its own connection.
type batcher struct {
	once  sync.Once
	queue chan *batchItem
}

// viaBatch runs the first attempt of d in a batch. It returns like attempt.
func (in *Inbox) viaBatch(d *delivery, h message.HandlerFunc) (out []*message.Message, herr, err error) {
	in.batch.once.Do(func() {
		in.batch.queue = make(chan *batchItem, in.cfg.BatchSize*in.cfg.BatchWorkers)
		for range in.cfg.BatchWorkers {
			go in.batchWorker()
		}
	})
	item := &batchItem{d: d, h: h, done: make(chan batchResult, 1)}
	in.batch.queue <- item
	res := <-item.done
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

// batchWorker takes whatever deliveries are waiting, up to BatchSize, and
// runs them as one transaction, for as long as the process lives.
func (in *Inbox) batchWorker() {
	for first := range in.batch.queue {
		items := []*batchItem{first}
	gather:
		for len(items) < in.cfg.BatchSize {
			select {
			case it := <-in.batch.queue:
				items = append(items, it)
			default:
				break gather
			}
		}
		results := in.runBatch(items)
		for i, it := range items {
			it.done <- results[i]
		}
	}
}

// runBatch runs items in one transaction and returns a result for each.
func (in *Inbox) runBatch(items []*batchItem) []batchResult {
	results := make([]batchResult, len(items))
	fallbackAll := func() []batchResult {
		for i := range results {
			results[i] = batchResult{fallback: true}
		}
		return results
	}
	// The batch outlives no delivery's shutdown: like attempt, it does not
	// inherit cancellation, and it is bounded by TxTimeout.
	ctx, cancel := in.txContext(items[0].d)
	defer cancel()
	tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fallbackAll()
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	deadline, _ := ctx.Deadline()
	for i, it := range items {
		// Each message keeps its own context (its trace span, its values),
		// without its cancellation, within the batch's deadline.
		ictx, cancel := context.WithDeadline(context.WithoutCancel(it.d.msg.Context()), deadline)
		res, err := in.batchOne(ictx, tx, it)
		cancel()
		if err != nil || tx.Conn().IsClosed() {
			return fallbackAll() // the transaction is gone: everyone alone
		}
		results[i] = res
	}
	failpoint.Hit(failpoint.AfterHandlerBeforeCommit, items[0].d.id)
	if err := tx.Commit(ctx); err != nil {
		return fallbackAll()
	}
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
			INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT DO NOTHING`, in.cfg.Consumer, d.id, d.sum[:], d.topic)
		if err != nil {
			return batchResult{}, fmt.Errorf("inbox: inserting inbox row: %w", err)
		}
		if tag.RowsAffected() == 0 {
			o, reason, err := in.classifySeen(ctx, sp, d)
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
