package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
)

// One delivery's path through the inbox, in the order a reader meets it:
//
//	middleware.go  Middleware / Handler → deliver: checks the message, then
//	               the retry loop (attempt, or the first attempt in a batch)
//	attempt.go     attempt: one transaction: the inbox row, applier.apply,
//	               commit
//	batch.go       the same steps for deliveries that share a transaction
//	deadletter.go  a failed attempt counted; a dead letter
//	hold.go        the key policy each of those asks at one point (in.keys):
//	               it writes the inbox row, and under HoldKey holds the key
//	rows.go        the inbox row's one INSERT; a copy already recorded →
//	               classifySeen (duplicate, conflict); a quarantine row
//	outcome.go     settle: the outcome counted, traced and reported
//
// Middleware and Handler differ only in their applier: a Watermill handler
// run per message, or a BatchFunc that takes every new message of a batch.

// Middleware returns h wrapped so that each message is applied at most once
// per consumer, and never acknowledged before its effects are committed:
//
//  1. begin a transaction; INSERT the inbox row ON CONFLICT DO NOTHING;
//  2. if the row existed: same payload → skip (duplicate); other payload →
//     quarantine (conflict). Either way the message is acknowledged;
//  3. otherwise run h with the transaction in the message context, commit,
//     and only then return, so the router acknowledges and watermill-kafka
//     marks the offset after the commit;
//  4. if h fails, roll back, count the attempt in its own transaction, back
//     off and try again; after MaxAttempts (or at once for Permanent errors)
//     record a dead letter and publish it through the outbox, in one
//     transaction, and acknowledge, so a poison message never blocks its
//     partition.
//
// An error is returned to the router only when the database is unreachable:
// the message is then redelivered, which the inbox makes harmless.
func (in *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return in.deliver(&perMessage{h: h})
}

// BatchFunc applies msgs in tx, the inbox's transaction, and must neither
// commit nor roll it back. Every message in msgs is new to the consumer: the
// inbox has already recorded it and filtered out duplicates. An error fails
// the whole batch, and nothing of it commits; the inbox then splits the batch
// in halves and calls the BatchFunc again with each, down to the message that
// causes the error, so its companions still commit in batches and the error
// is pinned on that message: it is retried alone and, after MaxAttempts,
// dead-lettered (wrap the error with Permanent to dead-letter it at once).
// ctx carries the batch's deadline and the transaction (TxFromContext);
// each message keeps its own context.
type BatchFunc func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error

// Handler returns a Watermill handler that applies each message at most once
// per consumer, like [Inbox.Middleware], through fn: up to Config.BatchSize
// deliveries that arrive together are applied by one call of fn, in one
// transaction (while [Inbox.Run] runs). With BatchSize 1, fn sees one message
// per transaction.
func (in *Inbox) Handler(fn BatchFunc) message.NoPublishHandlerFunc {
	deliver := in.deliver(&perBatch{fn: fn})
	return func(msg *message.Message) error {
		_, err := deliver(msg)
		return err
	}
}

// applier applies messages new to the consumer in the inbox's transaction,
// and must neither commit nor roll it back. An error fails every message of
// the call.
type applier interface {
	apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error
	// setBased reports whether one call may take several messages; a
	// per-message applier gets a savepoint per message in a batch.
	setBased() bool
}

// perMessage is Middleware's applier: the Watermill handler, one message at
// a time, with the transaction in the message's context (TxFromContext).
type perMessage struct{ h message.HandlerFunc }

func (p *perMessage) setBased() bool { return false }

func (p *perMessage) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
	for _, msg := range msgs {
		out, err := callHandler(p.h, msg, context.WithValue(ctx, txKey{}, tx))
		if err == nil && len(out) > 0 {
			// The router would publish these after the commit, outside the
			// transaction: lost if the process dies in between, since the
			// redelivery is then a duplicate. Refuse them loudly.
			err = Permanent(errors.New("the handler returned messages; write them with outbox.PublishTx on the inbox transaction instead"))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// perBatch is Handler's applier: a BatchFunc, given every new message at once.
type perBatch struct{ fn BatchFunc }

func (p *perBatch) setBased() bool { return true }

func (p *perBatch) apply(ctx context.Context, tx pgx.Tx, msgs []*message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return p.fn(context.WithValue(ctx, txKey{}, tx), tx, msgs) // TxFromContext(ctx) works here too
}

// deliver is the handler Middleware and Handler return: it reads the
// delivery (quarantining what cannot be deduplicated), then runs attempts
// until one commits, the message is dead-lettered, or the database fails;
// then what its key asks after a commit (HoldKey: a key it released, the
// key's parked messages).
func (in *Inbox) deliver(a applier) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		span := in.startSpan(msg) // tracing.go: one span per delivery, child of the producer's trace
		defer span.End()
		failpoint.Hit(failpoint.BeforeBegin, msg.UUID)
		d, reason := in.read(msg)
		if reason != "" {
			return nil, in.quarantineInvalid(d, reason) // deadletter.go
		}

		committed, err := in.run(d, a)
		if err != nil || !committed {
			return nil, err
		}
		failpoint.Hit(failpoint.AfterCommitBeforeAck, d.id)
		return nil, in.keys.afterCommit(d, a) // hold.go
	}
}

// run runs d through the retry loop: its first attempt in a batch while Run
// runs, the others alone.
func (in *Inbox) run(d *delivery, a applier) (committed bool, err error) {
	return in.retry(d, func(first bool) (herr, err error) {
		if first {
			return in.firstAttempt(d, a) // batch.go: in a batch while Run runs
		}
		return in.attempt(d, a) // attempt.go
	})
}

// retry is the retry loop: it runs attempts of d (try, first for the first
// one) until one commits (committed is true: applied, or settled as a
// duplicate, a conflict or parked), d is dead-lettered, or the database
// fails (err). try returns like attempt.
func (in *Inbox) retry(d *delivery, try func(first bool) (herr, err error)) (committed bool, err error) {
	transientFailures := 0
	for {
		herr, err := try(d.attempts == 0 && transientFailures == 0)
		var te transientError
		if errors.As(err, &te) {
			// The database failed under the handler. Wait and try again
			// without counting an attempt; but a failure that keeps
			// coming back for this one message (a handler that always
			// times out) is the message's, and counts after a while, so
			// it cannot block its partition forever.
			if transientFailures++; transientFailures < maxTransientFailures {
				if !ctxtime.Sleep(d.msg.Context(), in.backoff(transientFailures)) {
					return false, err
				}
				continue
			}
			transientFailures, herr, err = 0, te.err, nil
		}
		if err != nil {
			return false, err // database trouble: let the broker redeliver
		}
		if herr == nil {
			return true, nil
		}
		if IsPermanent(herr) {
			return false, in.deadLetter(d, d.attempts+1, "permanent error: "+herr.Error())
		}
		attempts, err := in.recordAttempt(d, herr)
		if err != nil {
			return false, err
		}
		d.attempts = attempts
		if attempts >= in.cfg.MaxAttempts {
			return false, in.deadLetter(d, attempts, fmt.Sprintf("failed %d attempts, last: %v", attempts, herr))
		}
		in.settle(d, Retried, herr.Error())
		if !ctxtime.Sleep(d.msg.Context(), in.backoff(attempts)) {
			return false, fmt.Errorf("inbox: shutting down while retrying: %w", herr)
		}
	}
}

func (in *Inbox) backoff(attempts int) time.Duration {
	b := in.cfg.RetryBackoff
	for i := 1; i < attempts && b < in.cfg.MaxRetryBackoff; i++ {
		b *= 2
	}
	return min(b, in.cfg.MaxRetryBackoff)
}

// callHandler runs h with ctx as the message context, restores the original
// context afterwards, and turns a panic into an error.
func callHandler(h message.HandlerFunc, msg *message.Message, ctx context.Context) (out []*message.Message, err error) {
	orig := msg.Context()
	msg.SetContext(ctx)
	defer func() {
		msg.SetContext(orig)
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(msg)
}
