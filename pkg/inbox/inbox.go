package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the inbox's SQL migrations, for projects that run their
// own migration tool. Migrate applies them.
var Migrations, _ = fs.Sub(migrations, "migrations")

// Migrate creates or upgrades the inbox tables. It is safe to call from
// several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate.Apply(ctx, pool, "inbox", Migrations)
}

// Outcome is how a delivery was settled.
type Outcome string

// The outcomes of a delivery.
const (
	Applied      Outcome = "applied"       // handler ran and its transaction committed
	Duplicate    Outcome = "duplicate"     // already applied with the same payload: handler skipped
	Conflict     Outcome = "conflict"      // id already applied with another payload: quarantined
	Invalid      Outcome = "invalid"       // no id, or payload too large: quarantined
	DeadLettered Outcome = "dead_lettered" // handler failed permanently or MaxAttempts times
	Retried      Outcome = "retried"       // handler failed; the message will be tried again
)

// Event describes one settled delivery, or one failed attempt (Retried).
type Event struct {
	Consumer  string
	MessageID string
	Outcome   Outcome
	Attempt   int           // attempts so far, for Retried and DeadLettered
	Reason    string        // why it was quarantined, dead-lettered or retried
	Duration  time.Duration // from delivery to settlement
}

// Stats counts outcomes since the Inbox was created.
type Stats struct {
	Applied, Duplicates, Conflicts, Invalid, DeadLettered, Retries int64
}

// Inbox deduplicates deliveries for one consumer. Its Middleware wraps a
// Watermill handler.
type Inbox struct {
	cfg      Config
	spanName string // "inbox <consumer>"
	batch    batcher
	stats    [6]atomic.Int64 // indexed by outcomeIndex
}

// New checks cfg and returns an Inbox.
func New(cfg Config) (*Inbox, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Inbox{cfg: cfg, spanName: "inbox " + cfg.Consumer}, nil
}

// Consumer returns the configured consumer name.
func (in *Inbox) Consumer() string { return in.cfg.Consumer }

// Stats returns the outcome counters.
func (in *Inbox) Stats() Stats {
	return Stats{
		Applied:      in.stats[0].Load(),
		Duplicates:   in.stats[1].Load(),
		Conflicts:    in.stats[2].Load(),
		Invalid:      in.stats[3].Load(),
		DeadLettered: in.stats[4].Load(),
		Retries:      in.stats[5].Load(),
	}
}

func outcomeIndex(o Outcome) int {
	switch o {
	case Applied:
		return 0
	case Duplicate:
		return 1
	case Conflict:
		return 2
	case Invalid:
		return 3
	case DeadLettered:
		return 4
	default:
		return 5
	}
}

type txKey struct{}

// TxFromContext returns the transaction the inbox opened for the message
// being handled. The handler does its domain writes and its outbox writes on
// it, and must neither commit nor roll it back.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Tx is TxFromContext for handlers that run only behind the middleware. It
// panics when there is no transaction, which is a wiring error.
func Tx(ctx context.Context) pgx.Tx {
	tx, ok := TxFromContext(ctx)
	if !ok {
		panic("inbox: no transaction in context; is the handler wrapped by Inbox.Middleware?")
	}
	return tx
}

// permanent marks an error that retrying cannot fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so the middleware dead-letters the message at once
// instead of retrying it: malformed JSON, an unknown schema version, a
// reference to something that does not exist.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was wrapped by Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

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
	return in.handler(h, nil)
}

// handler is Middleware for h; with set, the first attempt of a delivery may
// run in a set-based batch (batch.go, Inbox.Handler).
func (in *Inbox) handler(h message.HandlerFunc, set *setHandler) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		span := in.startSpan(msg) // tracing.go: one span per delivery, child of the producer's trace
		defer span.End()
		failpoint.Hit(failpoint.BeforeBegin, msg.UUID)
		start := time.Now()
		d := delivery{msg: msg, topic: message.SubscribeTopicFromCtx(msg.Context()), start: start}
		if in.cfg.Position != nil {
			if p, o, ok := in.cfg.Position(msg); ok {
				d.part, d.offset = &p, &o
			}
		}
		d.sum = sha256.Sum256(msg.Payload)

		id, err := in.cfg.MessageID(msg)
		switch {
		case err != nil:
			return nil, in.quarantineInvalid(&d, fmt.Sprintf("reading message id: %v", err))
		case id == "":
			return nil, in.quarantineInvalid(&d, "message has no id")
		case len(id) > maxIDBytes:
			return nil, in.quarantineInvalid(&d, fmt.Sprintf("message id of %d bytes exceeds the %d-byte limit", len(id), maxIDBytes))
		case id != pgText(id):
			return nil, in.quarantineInvalid(&d, fmt.Sprintf("message id %q is not valid UTF-8 text", id))
		}
		d.id = id
		if in.cfg.CheckID != nil {
			if err := in.cfg.CheckID(id); err != nil {
				return nil, in.quarantineInvalid(&d, fmt.Sprintf("message id %q is not in the issued format: %v", id, err))
			}
		}
		if len(msg.Payload) > in.cfg.MaxPayloadBytes {
			return nil, in.quarantineInvalid(&d, fmt.Sprintf("payload of %d bytes exceeds the %d-byte limit", len(msg.Payload), in.cfg.MaxPayloadBytes))
		}

		transientFailures := 0
		for {
			var out []*message.Message
			var herr error
			if in.cfg.BatchSize > 1 && d.attempts == 0 && transientFailures == 0 {
				out, herr, err = in.viaBatch(&d, h, set) // batch.go
			} else {
				out, herr, err = in.attempt(&d, h)
			}
			var te transientError
			if errors.As(err, &te) {
				// The database failed under the handler. Wait and try again
				// without counting an attempt; but a failure that keeps
				// coming back for this one message (a handler that always
				// times out) is the message's, and counts after a while, so
				// it cannot block its partition forever.
				if transientFailures++; transientFailures < maxTransientFailures {
					if !ctxtime.Sleep(msg.Context(), in.backoff(transientFailures)) {
						return nil, err
					}
					continue
				}
				transientFailures, herr, err = 0, te.err, nil
			}
			if err != nil {
				return nil, err // database trouble: let the broker redeliver
			}
			if herr == nil {
				failpoint.Hit(failpoint.AfterCommitBeforeAck, d.id)
				return out, nil
			}
			if IsPermanent(herr) {
				return nil, in.deadLetter(&d, d.attempts+1, "permanent error: "+herr.Error())
			}
			attempts, err := in.recordAttempt(&d, herr)
			if err != nil {
				return nil, err
			}
			d.attempts = attempts
			if attempts >= in.cfg.MaxAttempts {
				return nil, in.deadLetter(&d, attempts, fmt.Sprintf("failed %d attempts, last: %v", attempts, herr))
			}
			in.settle(&d, Retried, herr.Error())
			if !ctxtime.Sleep(msg.Context(), in.backoff(attempts)) {
				return nil, fmt.Errorf("inbox: shutting down while retrying: %w", herr)
			}
		}
	}
}

// delivery is one message on its way through the middleware.
type delivery struct {
	msg      *message.Message
	id       string
	topic    string
	part     *int32 // where Kafka holds it (watermill-kafka's context), nil elsewhere
	offset   *int64
	sum      [32]byte
	attempts int // failed attempts recorded so far by this process
	start    time.Time
}

func (in *Inbox) txContext(d *delivery) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(d.msg.Context()), in.cfg.TxTimeout)
}

// attempt runs one transaction. herr is the handler's error (rolled back);
// err is an infrastructure error (the outcome is unknown or nothing ran).
func (in *Inbox) attempt(d *delivery, h message.HandlerFunc) (out []*message.Message, herr, err error) {
	ctx, cancel := in.txContext(d)
	defer cancel()
	// Read committed, whatever the database's default: a concurrent
	// duplicate then waits for the first delivery's inbox row instead of
	// failing with a serialization error.
	tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	if !in.cfg.DisableDedupe {
		tag, err := tx.Exec(ctx, `
			INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, kafka_partition, kafka_offset)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT DO NOTHING`, in.cfg.Consumer, d.id, d.sum[:], d.topic, d.part, d.offset)
		if err != nil {
			return nil, nil, fmt.Errorf("inbox: inserting inbox row: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil, nil, in.seenBefore(ctx, tx, d)
		}
		failpoint.Hit(failpoint.AfterInboxInsert, d.id)
	}

	if d.attempts > 0 {
		// Cleared before the handler runs, while the transaction is sure to be
		// healthy (a handler that swallowed a failed statement leaves it
		// aborted); a failed attempt rolls the deletion back with the rest.
		if _, err := tx.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, in.cfg.Consumer, d.id); err != nil {
			return nil, nil, fmt.Errorf("inbox: clearing attempts: %w", err)
		}
	}
	out, herr = callHandler(h, d.msg, context.WithValue(ctx, txKey{}, tx))
	if herr != nil {
		// The deferred rollback undoes the inbox row and every domain write.
		if transient(tx, herr) {
			return nil, nil, transientError{herr}
		}
		return nil, herr, nil
	}
	if len(out) > 0 {
		// The router would publish these after the commit, outside the
		// transaction: lost if the process dies in between, since the
		// redelivery is then a duplicate. Refuse them loudly.
		return nil, Permanent(errors.New("the handler returned messages; write them with outbox.PublishTx on the inbox transaction instead")), nil
	}
	failpoint.Hit(failpoint.AfterHandlerBeforeCommit, d.id)
	if err := tx.Commit(ctx); err != nil {
		if commitRefused(tx, err) {
			return nil, fmt.Errorf("commit refused: %w", err), nil
		}
		return nil, nil, fmt.Errorf("inbox: commit: %w", err)
	}
	in.settle(d, Applied, "")
	return out, nil, nil
}

// maxTransientFailures is how many database failures in a row under the
// handler one delivery absorbs before the next one counts as a failed
// attempt.
const maxTransientFailures = 10

// transientError is a database failure under the handler (see transient).
type transientError struct{ err error }

func (e transientError) Error() string {
	return "inbox: database failed under the handler: " + e.err.Error()
}
func (e transientError) Unwrap() error { return e.err }

// transient reports whether a handler error says the database failed, not
// the handler: the connection is gone, the server is restarting or shutting
// down, it ran out of resources, a serialization failure or deadlock, or the
// attempt timed out. Such failures are not the message's fault: they do not
// count towards MaxAttempts, and the message is redelivered instead, so a
// Postgres restart never dead-letters good messages.
func transient(tx pgx.Tx, err error) bool {
	if tx.Conn().IsClosed() {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "57014" { // query_canceled: the handler's statement timed out
			return false
		}
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57":
			return true
		}
		return false
	}
	return pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err)
}

// commitRefused reports whether the server refused the COMMIT because of what
// the handler's transaction did: a deferred constraint failed, or a statement
// had failed and the handler went on (pgx.ErrTxCommitRollback). Nothing was
// committed. The attempt counts as failed, like a handler error, so it is
// retried and finally dead-lettered; returned to the broker it would come back
// forever and block its partition. Database failures (transient) still go
// back to the broker.
func commitRefused(tx pgx.Tx, err error) bool {
	var pgErr *pgconn.PgError
	return (errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback)) && !transient(tx, err)
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

// seenBefore settles a delivery whose inbox row already exists: a duplicate
// when the payload matches, a quarantined conflict when it does not.
func (in *Inbox) seenBefore(ctx context.Context, tx pgx.Tx, d *delivery) error {
	o, reason, err := in.classifySeen(ctx, tx, d, "")
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: commit: %w", err)
	}
	in.settleSeen(d, o, reason)
	return nil
}

// classifySeen writes, in tx, what a delivery of an already-recorded id
// leaves behind: the duplicate counted durably (only redeliveries pay for
// this write), or the conflicting payload quarantined with both hashes. It
// commits nothing. Every path that finds the id's inbox row already there
// settles through it: one that settled without comparing the hashes would
// drop a different payload as a duplicate. failed, when not empty, is why
// this delivery was being dead-lettered, kept in the conflict's reason.
func (in *Inbox) classifySeen(ctx context.Context, tx pgx.Tx, d *delivery, failed string) (Outcome, string, error) {
	var prior []byte
	var status string
	if err := tx.QueryRow(ctx, `SELECT payload_sha256, status FROM inbox_messages WHERE consumer = $1 AND message_id = $2`,
		in.cfg.Consumer, d.id).Scan(&prior, &status); err != nil {
		return "", "", fmt.Errorf("inbox: reading inbox row: %w", err)
	}
	if bytes.Equal(prior, d.sum[:]) {
		if err := in.recordCopy(ctx, tx, d, 1); err != nil {
			return "", "", fmt.Errorf("inbox: counting duplicate: %w", err)
		}
		return Duplicate, "", nil
	}
	// A conflicting copy Kafka still holds would be applied if its row
	// were swept: the row stays while Kafka holds it too.
	if err := in.recordCopy(ctx, tx, d, 0); err != nil {
		return "", "", fmt.Errorf("inbox: recording the conflicting copy's offset: %w", err)
	}
	done := "applied"
	if status == "dead_lettered" {
		done = "dead-lettered" // so an operator does not look for its effects
	}
	reason := fmt.Sprintf("message id %s was already %s with payload sha256 %x; this delivery has sha256 %x", d.id, done, prior, d.sum)
	if failed != "" {
		reason += "; its handler had failed: " + failed
	}
	if err := in.insertQuarantine(ctx, tx, d, "payload_conflict", reason, prior); err != nil {
		return "", "", err
	}
	return Conflict, reason, nil
}

// recordCopy notes another copy of d's message on its inbox row, adding dup
// to its duplicates: the row stays while Kafka holds any copy this consumer
// saw (Config.LogStart), so it keeps the highest offset, or -1 for the
// partition when copies came on several partitions (swept by age alone).
func (in *Inbox) recordCopy(ctx context.Context, tx pgx.Tx, d *delivery, dup int) error {
	_, err := tx.Exec(ctx, `
		UPDATE inbox_messages SET duplicates = duplicates + $5,
			kafka_partition = CASE WHEN $3::int IS NULL OR kafka_partition IS NULL OR kafka_partition = $3 THEN kafka_partition ELSE -1 END,
			kafka_offset = CASE WHEN $3::int IS NOT NULL AND kafka_partition = $3 THEN greatest(kafka_offset, $4::bigint) ELSE kafka_offset END
		WHERE consumer = $1 AND message_id = $2`,
		in.cfg.Consumer, d.id, d.part, d.offset, dup)
	return err
}

// settleSeen settles a committed duplicate or conflict.
func (in *Inbox) settleSeen(d *delivery, o Outcome, reason string) {
	if o == Conflict {
		in.cfg.Logger.Error("Inbox quarantined a payload conflict", errors.New(reason), in.fields(d))
	}
	in.settle(d, o, reason)
}

// quarantineInvalid records a message that cannot be deduplicated or read.
func (in *Inbox) quarantineInvalid(d *delivery, reason string) error {
	ctx, cancel := in.txContext(d)
	defer cancel()
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
		return in.insertQuarantine(ctx, tx, d, "invalid", reason, nil)
	})
	if err != nil {
		return err
	}
	in.cfg.Logger.Error("Inbox quarantined an invalid message", errors.New(reason), in.fields(d))
	in.settle(d, Invalid, reason)
	return nil
}

// maxIDBytes bounds a message id: it is a key of btree indexes, whose entries
// Postgres caps at about 2.7 kB. A longer id is quarantined as invalid.
const maxIDBytes = 1024

// pgText returns s as a Postgres text or jsonb value can hold it: invalid
// UTF-8 and NUL bytes become U+FFFD. Message ids, metadata and handler errors
// come from producers and handlers; a value the database refuses would fail
// the delivery on every redelivery and block the partition.
func pgText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func (in *Inbox) insertQuarantine(ctx context.Context, tx pgx.Tx, d *delivery, kind, reason string, prior []byte) error {
	md := make(map[string]string, len(d.msg.Metadata))
	for k, v := range d.msg.Metadata {
		md[pgText(k)] = pgText(v)
	}
	meta, err := json.Marshal(md)
	if err != nil {
		return fmt.Errorf("inbox: encoding metadata: %w", err)
	}
	onConflict := "ON CONFLICT (consumer, kind, message_id, payload_sha256) WHERE kind <> 'dead_letter' DO NOTHING"
	if kind == "dead_letter" {
		onConflict = ""
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, attempts, topic, payload_sha256, original_sha256, payload, metadata)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) `+onConflict,
		in.cfg.Consumer, d.id, kind, pgText(reason), d.attempts, d.topic, d.sum[:], prior, d.msg.Payload, meta)
	if err != nil {
		return fmt.Errorf("inbox: recording %s: %w", kind, err)
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
		RETURNING attempts`, in.cfg.Consumer, d.id, pgText(herr.Error())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("inbox: recording attempt: %w", err)
	}
	in.cfg.Logger.Info("Inbox handler failed; will retry", in.fields(d).Add(watermill.LogFields{"attempt": n, "err": herr.Error()}))
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
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
		if !in.cfg.DisableDedupe {
			tag, err := tx.Exec(ctx, `
				INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic, status, kafka_partition, kafka_offset)
				VALUES ($1, $2, $3, $4, 'dead_lettered', $5, $6)
				ON CONFLICT DO NOTHING`, in.cfg.Consumer, d.id, d.sum[:], d.topic, d.part, d.offset)
			if err != nil {
				return fmt.Errorf("inbox: inserting dead-letter row: %w", err)
			}
			if tag.RowsAffected() == 0 {
				// Another delivery of the id finished first: often one that
				// waited on this delivery's row and was applied once this
				// one's failed attempt rolled back. Its payload may be
				// another, so this one is settled against its row like any
				// redelivery, never taken for a duplicate unseen.
				settled, seenReason, err = in.classifySeen(ctx, tx, d, reason)
				return err
			}
		}
		settled = DeadLettered
		if err := in.insertQuarantine(ctx, tx, d, "dead_letter", reason, nil); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, in.cfg.Consumer, d.id); err != nil {
			return fmt.Errorf("inbox: clearing attempts: %w", err)
		}
		return outbox.PublishTx(ctx, tx, in.cfg.DeadLetterTopic, deadLetterMessage(d, in.cfg.Consumer, attempts, reason))
	})
	if err != nil {
		return err
	}
	if settled != DeadLettered {
		in.settleSeen(d, settled, seenReason)
		return nil
	}
	in.cfg.Logger.Error("Inbox dead-lettered a message", errors.New(reason), in.fields(d))
	in.settle(d, DeadLettered, reason)
	return nil
}

// PayloadOmittedMetadata is set on a dead letter whose payload (or whose
// original metadata too) was left out because, with the dead letter's
// headers, it would pass the producer's limit: the row would be one no
// broker takes. It says what was left out; inbox_quarantine keeps all of it.
const PayloadOmittedMetadata = "dead_letter_payload_omitted"

// deadLetterRoom is what the dead letter leaves for the metadata PublishTx
// adds (the write time and a trace context take ~150 bytes).
const deadLetterRoom = 1024

// deadLetterMessage is the message published to the dead-letter topic: the
// original payload and metadata, plus the dead_letter_* headers. When that
// would not fit outbox.DefaultMaxMessageBytes, the payload is left out, and
// then the original metadata, and PayloadOmittedMetadata says so.
func deadLetterMessage(d *delivery, consumer string, attempts int, reason string) *message.Message {
	headers := message.Metadata{
		"dead_letter_reason":     pgText(reason),
		"dead_letter_consumer":   consumer,
		"dead_letter_message_id": d.id,
		"dead_letter_topic":      d.topic,
		"dead_letter_attempts":   fmt.Sprint(attempts),
	}
	build := func(payload []byte, original message.Metadata) *message.Message {
		dlq := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
		for k, v := range original {
			dlq.Metadata.Set(pgText(k), pgText(v))
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

func (in *Inbox) settle(d *delivery, o Outcome, reason string) {
	in.stats[outcomeIndex(o)].Add(1)
	traceOutcome(d.msg.Context(), o, d.attempts, reason) // tracing.go
	if in.cfg.OnOutcome != nil {
		in.cfg.OnOutcome(Event{
			Consumer: in.cfg.Consumer, MessageID: d.id, Outcome: o,
			Attempt: d.attempts, Reason: reason, Duration: time.Since(d.start),
		})
	}
}

func (in *Inbox) fields(d *delivery) watermill.LogFields {
	return watermill.LogFields{"consumer": in.cfg.Consumer, "message_id": d.id, "topic": d.topic}
}

func (in *Inbox) backoff(attempts int) time.Duration {
	b := in.cfg.RetryBackoff
	for i := 1; i < attempts && b < in.cfg.MaxRetryBackoff; i++ {
		b *= 2
	}
	return min(b, in.cfg.MaxRetryBackoff)
}

// Sweep deletes inbox rows and stale attempt counters older than Retention,
// in batches, and returns how many inbox rows it removed. Quarantined and
// dead-lettered messages are kept in inbox_quarantine until an operator
// deals with them.
func (in *Inbox) Sweep(ctx context.Context) (int64, error) {
	// With Config.LogStart, a row read from Kafka goes only once its
	// partition's log start has passed the highest offset of its copies;
	// by age alone: rows without an offset (not read from Kafka, or from
	// before migration 003), with copies on several partitions (-1), or of
	// a topic LogStart does not report (one no longer consumed).
	var topics []string
	var parts []int32
	var starts []int64
	if in.cfg.LogStart != nil {
		ls, err := in.cfg.LogStart(ctx)
		if err != nil {
			return 0, fmt.Errorf("inbox: sweep: reading Kafka's log-start offsets: %w", err)
		}
		for topic, ps := range ls {
			for p, start := range ps {
				topics, parts, starts = append(topics, topic), append(parts, p), append(starts, start)
			}
		}
	}
	var total int64
	for {
		tag, err := in.cfg.Pool.Exec(ctx, `
			DELETE FROM inbox_messages
			WHERE (consumer, message_id) IN (
				SELECT m.consumer, m.message_id FROM inbox_messages m
				WHERE m.consumer = $1 AND m.processed_at < now() - $2::interval
				AND (NOT $4 OR m.kafka_offset IS NULL OR m.kafka_partition = -1 OR NOT m.topic = ANY($5) OR EXISTS (
					SELECT 1 FROM unnest($5::text[], $6::int[], $7::bigint[]) AS k(topic, part, start)
					WHERE k.topic = m.topic AND k.part = m.kafka_partition AND m.kafka_offset < k.start))
				ORDER BY m.processed_at
				LIMIT $3)`, pgx.QueryExecModeExec, in.cfg.Consumer, in.cfg.Retention, in.cfg.RetentionBatch, // planned for the table as it is now (see outbox's planEachTime)
			in.cfg.LogStart != nil, topics, parts, starts)
		if err != nil {
			return total, fmt.Errorf("inbox: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(in.cfg.RetentionBatch) {
			break
		}
	}
	if _, err := in.cfg.Pool.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND updated_at < now() - $2::interval`,
		in.cfg.Consumer, in.cfg.Retention); err != nil {
		return total, fmt.Errorf("inbox: sweeping attempts: %w", err)
	}
	return total, nil
}

// RunRetention calls Sweep every interval until ctx ends.
func (in *Inbox) RunRetention(ctx context.Context, interval time.Duration) {
	ctxtime.Every(ctx, interval, func() {
		if n, err := in.Sweep(ctx); err != nil && ctx.Err() == nil {
			in.cfg.Logger.Error("Inbox retention sweep failed", err, nil)
		} else if n > 0 {
			in.cfg.Logger.Info("Inbox retention sweep", watermill.LogFields{"consumer": in.cfg.Consumer, "deleted": n})
		}
	})
}
