package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// One delivery's path through the inbox, in the order a reader meets it.
// This file is the path itself, top to bottom: deliver reads the message,
// run and retry loop over attempts, attempt is one transaction (the inbox
// row, the applier, the commit), a dead letter and a quarantine are written
// here, and every way a delivery ends is settled here, in one place
// (settle). What it asks, each at one point, is in the files beneath it,
// and none of them calls back up:
//
//	batch.go       the batches a first attempt joins while Run runs
//	hold.go        HoldKey's policy (in.keys): the inbox row inside the
//	               key's hold; a released key's parked messages drained
//	stages.go      the checks a delivery passes before its id is looked up
//	rows.go        the inbox row's one INSERT and its key's continuity;
//	               a copy seen before (classifySeen: duplicate, conflict);
//	               a quarantine row
//	delivery.go    what moves along the path: the Inbox, a delivery, a batch
//	               item, the seams the path calls (applier, keyPolicy, stage)
//	config.go      Config and the types it holds
//	outcome.go     the outcomes, Event, Breach
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
			if err := in.quarantineInvalid(d, reason); err != nil {
				return nil, err
			}
			return nil, in.heldByStandbys(d)
		}
		if err := in.checkShape(d); err != nil {
			return nil, err
		}

		committed, err := in.run(d, a)
		if err == nil {
			err = in.heldByStandbys(d) // applied, seen before, parked or dead-lettered: the offset may go
		}
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
			return in.firstAttempt(d, a) // in a batch while Run runs
		}
		return in.attempt(d, a)
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
				if !in.pause(d, transientFailures) {
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
		if !in.pause(d, attempts) {
			return false, fmt.Errorf("inbox: shutting down while retrying: %w", herr)
		}
	}
}

// firstAttempt runs the first attempt of d in a batch when batches run
// (BatchSize > 1 and Run running), alone otherwise. It returns like attempt.
func (in *Inbox) firstAttempt(d *delivery, a applier) (herr, err error) {
	if in.cfg.BatchSize < 2 {
		return in.attempt(d, a)
	}
	item := &batchItem{d: d, a: a, done: make(chan batchResult, 1)}
	in.batch.mu.RLock()
	q := in.batch.queue
	if q != nil {
		q.Put(context.Background(), item)
	}
	in.batch.mu.RUnlock()
	if q == nil {
		return in.attempt(d, a)
	}
	res := <-item.done
	q.Done()
	switch {
	case res.fallback:
		return in.attempt(d, a)
	case res.herr != nil:
		return res.herr, nil
	}
	in.settle(d, res.outcome, res.reason)
	return nil, nil
}

// attempt runs one delivery in a transaction of its own: the inbox row, the
// applier, the commit. herr is the handler's error (rolled back); err is an
// infrastructure error (the outcome is unknown or nothing ran).
func (in *Inbox) attempt(d *delivery, a applier) (herr, err error) {
	ctx, cancel := in.txContext(d)
	defer cancel()
	// Read committed, whatever the database's default: a concurrent
	// duplicate then waits for the first delivery's inbox row instead of
	// failing with a serialization error.
	tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	if !in.cfg.disableDedupe {
		// The inbox row, as its key's policy writes it (hold.go). A copy
		// seen before, or a message of a held key (parked), is settled
		// without the handler.
		settled, reason, err := in.keys.admit(ctx, tx, d)
		if err != nil {
			return nil, err
		}
		if settled != "" {
			if err := in.commit(ctx, tx, d); err != nil {
				return nil, fmt.Errorf("inbox: commit: %w", err)
			}
			in.settle(d, settled, reason)
			return nil, nil
		}
	}
	return in.applyAndCommit(ctx, tx, d, a)
}

// applyAndCommit ends an attempt whose inbox row is written in tx: it clears
// the attempts counted before, runs the applier, and commits. Cleared before
// the handler runs, while the transaction is sure to be healthy (a handler
// that swallowed a failed statement leaves it aborted); a failed attempt
// rolls the clearing back with the rest. The handler runs between two crash
// windows; a parked message opens neither: it was acknowledged when it
// parked, and no redelivery follows a kill.
func (in *Inbox) applyAndCommit(ctx context.Context, tx pgx.Tx, d *delivery, a applier) (herr, err error) {
	if d.attempts > 0 {
		if err := in.clearAttempts(ctx, tx, d); err != nil {
			return nil, err
		}
	}
	windows := !d.parked
	if windows && !in.cfg.disableDedupe {
		failpoint.Hit(failpoint.AfterInboxInsert, d.id)
	}
	if herr := a.apply(ctx, tx, []*message.Message{d.msg}); herr != nil {
		// The caller's deferred rollback undoes the inbox row and every
		// domain write.
		if transient(tx, herr) {
			return nil, transientError{herr}
		}
		return herr, nil
	}
	if windows {
		failpoint.Hit(failpoint.AfterHandlerBeforeCommit, d.id)
	}
	if err := in.commit(ctx, tx, d); err != nil {
		if commitRefused(tx, err) {
			return fmt.Errorf("commit refused: %w", err), nil
		}
		return nil, fmt.Errorf("inbox: commit: %w", err)
	}
	in.settle(d, Applied, "")
	return nil, nil
}

// commit commits tx, which settles d, marked for Config.Standby.
func (in *Inbox) commit(ctx context.Context, tx pgx.Tx, d *delivery) error {
	if err := in.markForStandbys(ctx, tx, d); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// markForStandbys marks tx, which settles d (and whatever else it settles),
// for Config.Standby.
func (in *Inbox) markForStandbys(ctx context.Context, tx pgx.Tx, ds ...*delivery) error {
	if in.cfg.Standby == nil {
		return nil
	}
	ticket, err := in.cfg.Standby.Mark(ctx, tx)
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	for _, d := range ds {
		d.ticket, d.marked = ticket, true
	}
	return nil
}

// heldByStandbys waits, with Config.Standby, until the standbys a failover
// would promote hold the transaction that settled d: the broker's offset
// moves past a message only once a failover cannot take its inbox row back
// (the broker would never deliver it again: lost). An error leaves the
// offset; the message comes again, and its inbox row, if it survived,
// settles it as seen before.
func (in *Inbox) heldByStandbys(d *delivery) error {
	if !d.marked {
		return nil
	}
	ctx, cancel := in.txContext(d)
	defer cancel()
	if err := in.cfg.Standby.Wait(ctx, d.ticket); err != nil {
		return fmt.Errorf("inbox: message %s: %w", d.id, err)
	}
	return nil
}

// clearAttempts deletes d's count of failed attempts in tx.
func (in *Inbox) clearAttempts(ctx context.Context, tx pgx.Tx, d *delivery) error {
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, in.cfg.Consumer, d.id); err != nil {
		return fmt.Errorf("inbox: clearing attempts: %w", err)
	}
	return nil
}

// recordAttempt counts a failed attempt in its own transaction (the handler's
// was rolled back) and returns the total, which survives restarts.
func (in *Inbox) recordAttempt(d *delivery, herr error) (int, error) {
	ctx, cancel := in.txContext(d)
	defer cancel()
	var n int
	err := in.cfg.Pool.QueryRow(ctx, `
		INSERT INTO inbox_attempts (consumer, message_id, attempts, last_error)
		VALUES ($1, $2, 1, $3)
		ON CONFLICT (consumer, message_id) DO UPDATE
		SET attempts = inbox_attempts.attempts + 1, last_error = EXCLUDED.last_error, updated_at = now()
		RETURNING attempts`, in.cfg.Consumer, d.id, schema.Text(herr.Error())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("inbox: recording attempt: %w", err)
	}
	in.cfg.log.Info("Inbox handler failed; will retry", in.fields(d).Add(watermill.LogFields{"attempt": n, "err": herr.Error()}))
	return n, nil
}

// deadLetter records the message as finished-but-not-applied and publishes
// it to the dead-letter topic through the outbox, all in one transaction.
func (in *Inbox) deadLetter(d *delivery, attempts int, reason string) error {
	ctx, cancel := in.txContext(d)
	defer cancel()
	d.attempts = attempts
	var settled Outcome
	var seenReason string
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) (err error) {
		// Marked whatever settles d here (another delivery's row, seen,
		// is held once this transaction is).
		if err := in.markForStandbys(ctx, tx, d); err != nil {
			return err
		}
		// The inbox row and the quarantine, as its key's policy writes them
		// (hold.go: under HoldKey the key is held too).
		settled, seenReason, err = in.keys.recordDeadLetter(ctx, tx, d, reason)
		if err != nil || settled != DeadLettered {
			return err
		}
		if err := in.clearAttempts(ctx, tx, d); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, in.cfg.DeadLetterTopic, deadLetterMessage(d, in.cfg.Consumer, attempts, reason)) // deadletter.go
	})
	switch {
	case err != nil:
		return err
	case settled == DeadLettered:
		in.settle(d, DeadLettered, reason)
	case settled != "": // "": a parked message another delivery settled meanwhile
		in.settle(d, settled, seenReason)
	}
	return nil
}

// clipReason returns reason as text, cut at a character boundary to at most
// maxDeadLetterReasonBytes, saying so when it was cut.
func clipReason(reason string) string {
	reason = schema.Text(reason)
	if len(reason) <= maxDeadLetterReasonBytes {
		return reason
	}
	cut := maxDeadLetterReasonBytes
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes in all; inbox_quarantine keeps the whole reason)", reason[:cut], len(reason))
}

// deadLetterMessage is the message published to the dead-letter topic: the
// original payload and metadata, plus the dead_letter_* headers (the reason
// clipped to maxDeadLetterReasonBytes). When that would not fit
// outbox.DefaultMaxMessageBytes, the payload is left out, and then the
// original metadata, and PayloadOmittedMetadata says so. A record that had
// no value goes out with an empty one, as the outbox writes every payload;
// inbox_quarantine keeps the difference (a NULL payload).
func deadLetterMessage(d *delivery, consumer string, attempts int, reason string) *message.Message {
	headers := message.Metadata{
		"dead_letter_reason":     clipReason(reason),
		"dead_letter_consumer":   consumer,
		"dead_letter_message_id": d.id,
		"dead_letter_topic":      d.topic,
		"dead_letter_attempts":   fmt.Sprint(attempts),
	}
	build := func(payload []byte, original message.Metadata) *message.Message {
		dlq := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
		for k, v := range original {
			dlq.Metadata.Set(schema.Text(k), schema.Text(v))
		}
		for k, v := range headers {
			dlq.Metadata.Set(k, v)
		}
		return dlq
	}
	fits := func(m *message.Message) bool {
		return outbox.RecordBytes(m)+deadLetterRoom <= outbox.DefaultMaxMessageBytes
	}
	if dlq := build(d.msg.Payload, d.msg.Metadata); fits(dlq) {
		return dlq
	}
	kept := "inbox_quarantine keeps it (inboxctl show)"
	headers[PayloadOmittedMetadata] = fmt.Sprintf("payload of %d bytes left out: too large for a dead letter; %s", len(d.msg.Payload), kept)
	if dlq := build(nil, d.msg.Metadata); fits(dlq) {
		return dlq
	}
	headers[PayloadOmittedMetadata] = fmt.Sprintf("payload of %d bytes and %d metadata entries left out: too large for a dead letter; %s",
		len(d.msg.Payload), len(d.msg.Metadata), kept)
	return build(nil, nil)
}

// quarantineInvalid records a message that cannot be deduplicated or read.
func (in *Inbox) quarantineInvalid(d *delivery, reason string) error {
	ctx, cancel := in.txContext(d)
	defer cancel()
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
		if err := in.markForStandbys(ctx, tx, d); err != nil {
			return err
		}
		return in.insertQuarantine(ctx, tx, d, KindInvalid, reason, nil)
	})
	if err != nil {
		return err
	}
	in.settle(d, Invalid, reason)
	return nil
}

// settle is where every delivery ends, and every failed attempt is told:
// the outcome counted, logged when an operator must look, traced, and
// reported to Config.OnOutcome.
func (in *Inbox) settle(d *delivery, o Outcome, reason string) {
	switch o {
	case Conflict:
		in.cfg.log.Error("Inbox quarantined a payload conflict", errors.New(reason), in.fields(d))
	case Invalid:
		in.cfg.log.Error("Inbox quarantined an invalid message", errors.New(reason), in.fields(d))
	case DeadLettered:
		in.cfg.log.Error("Inbox dead-lettered a message", errors.New(reason), in.fields(d))
	}
	breaches := d.breaches // continuity.go: committed with the delivery, unless it is to be retried
	if o == Retried {
		breaches = nil
	}
	for _, b := range breaches {
		in.cfg.log.Error("Inbox saw a break in its key's history", errors.New(b.String()), in.fields(d))
	}
	in.stats[outcomeIndex(o)].Add(1)
	traceOutcome(d.msg.Context(), o, d.attempts, reason)
	if in.cfg.OnOutcome != nil {
		in.cfg.OnOutcome(Event{
			Consumer: in.cfg.Consumer, MessageID: d.id, Outcome: o,
			Attempt: d.attempts, Reason: reason, Duration: time.Since(d.start),
			Breaches: breaches,
		})
	}
}

// traceOutcome records a settled delivery on the span in ctx; a failed
// attempt that will be retried becomes a span event.
func traceOutcome(ctx context.Context, o Outcome, attempt int, reason string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if o == Retried {
		span.AddEvent("inbox.retry", trace.WithAttributes(
			attribute.Int("inbox.attempt", attempt), attribute.String("inbox.reason", reason)))
		return
	}
	span.SetAttributes(attribute.String(OutcomeAttribute, string(o)))
	if attempt > 0 {
		span.SetAttributes(attribute.Int("inbox.attempts", attempt))
	}
	switch o {
	case Conflict, Invalid, DeadLettered:
		span.SetAttributes(attribute.String("inbox.reason", reason))
		span.SetStatus(codes.Error, string(o))
	}
}

func (in *Inbox) fields(d *delivery) watermill.LogFields {
	return watermill.LogFields{"consumer": in.cfg.Consumer, "message_id": d.id, "topic": d.topic}
}

// pause waits the backoff after failures failures of d, and reports false
// when d's context ended first.
func (in *Inbox) pause(d *delivery, failures int) bool {
	select {
	case <-d.msg.Context().Done():
		return false
	case <-time.After(in.backoff(failures)):
		return true
	}
}

func (in *Inbox) backoff(attempts int) time.Duration {
	b := in.cfg.RetryBackoff
	for i := 1; i < attempts && b < in.cfg.MaxRetryBackoff; i++ {
		b *= 2
	}
	return min(b, in.cfg.MaxRetryBackoff)
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
