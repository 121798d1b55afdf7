package inboxadmin

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// The resolutions an operator records on a quarantined message.
const (
	ResolutionRedriven  = "redriven"
	ResolutionDiscarded = "discarded"
)

var (
	// ErrNotFound: no quarantined message has that id.
	ErrNotFound = errors.New("inbox: no quarantined message with that id")
	// ErrResolved: the message was already redriven or discarded.
	ErrResolved = errors.New("inbox: quarantined message already resolved")
	// ErrNotRedrivable: only dead letters with a UUID message id and a known
	// topic can be written back; discard the others.
	ErrNotRedrivable = errors.New("inbox: quarantined message cannot be redriven")
)

// Quarantined is one row of inbox_quarantine: a message the consumer did not
// apply, with everything needed to inspect, redrive or discard it.
type Quarantined struct {
	ID             int64
	Consumer       string
	MessageID      string
	Kind           string // inbox.KindDeadLetter, inbox.KindPayloadConflict or inbox.KindInvalid
	Reason         string
	Attempts       int
	Topic          string
	PayloadSHA256  []byte
	OriginalSHA256 []byte // payload_conflict: the hash of the payload that was applied
	// Payload is what the record carried: nil when it had no value at all
	// (a Kafka tombstone), empty when its value was empty (PayloadNull
	// tells the two apart).
	Payload     []byte
	PayloadNull bool
	Metadata    map[string]string
	// RawMetadata is set when Metadata had to change a header to store it
	// as text (a NUL byte, invalid UTF-8 become U+FFFD): every header
	// exactly as it arrived.
	RawMetadata map[string]string
	CreatedAt   time.Time

	// Set once an operator dealt with it.
	ResolvedAt     *time.Time
	Resolution     string // ResolutionRedriven or ResolutionDiscarded
	ResolvedBy     string
	ResolutionNote string
}

// QuarantineFilter selects rows for ListQuarantined.
type QuarantineFilter struct {
	Consumer string // empty: every consumer
	Kind     string // empty: every kind
	Group    string // empty: every failure group (Group.ID, groups.go); needs Consumer
	// Resolved also lists rows that were redriven or discarded.
	Resolved bool
	// After lists the rows after this id: the next page after a page whose
	// last row had it.
	After int64
	// Limit caps the rows returned, oldest first. Defaults to 1000.
	Limit int
	// WithoutPayloads leaves each row's Payload nil (PayloadNull and
	// PayloadSHA256 still tell what it carried): a list of a thousand
	// messages of up to a broker's megabyte each reads none of them.
	// GetQuarantined reads one.
	WithoutPayloads bool
}

// quarantineColumns are the columns scanQuarantined reads, with payload the
// payload's expression.
func quarantineColumns(payload string) string {
	return `id, consumer, message_id, kind, reason, attempts, topic, payload_sha256, original_sha256,
	` + payload + `, payload IS NULL, metadata, raw_metadata, created_at, resolved_at, coalesce(resolution, ''), coalesce(resolved_by, ''), coalesce(resolution_note, '')`
}

func scanQuarantined(row pgx.Row) (Quarantined, error) {
	var q Quarantined
	var raw map[string]string
	err := row.Scan(&q.ID, &q.Consumer, &q.MessageID, &q.Kind, &q.Reason, &q.Attempts, &q.Topic, &q.PayloadSHA256,
		&q.OriginalSHA256, &q.Payload, &q.PayloadNull, &q.Metadata, &raw, &q.CreatedAt, &q.ResolvedAt, &q.Resolution, &q.ResolvedBy, &q.ResolutionNote)
	if err != nil || raw == nil {
		return q, err
	}
	q.RawMetadata = make(map[string]string, len(raw))
	for k, v := range raw {
		name, err := base64.StdEncoding.DecodeString(k)
		if err != nil {
			return q, fmt.Errorf("inbox: quarantined message %d: raw_metadata name %q: %w", q.ID, k, err)
		}
		value, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return q, fmt.Errorf("inbox: quarantined message %d: raw_metadata value of %q: %w", q.ID, name, err)
		}
		q.RawMetadata[string(name)] = string(value)
	}
	return q, nil
}

// ListQuarantined returns the quarantined messages f selects, oldest first:
// by default the open ones, which an operator has yet to redrive or discard.
func (adm *Admin) ListQuarantined(ctx context.Context, f QuarantineFilter) ([]Quarantined, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	if f.Group != "" && f.Consumer == "" {
		return nil, errors.New("inbox: QuarantineFilter.Group needs its Consumer")
	}
	rows, err := adm.pool.Query(ctx, `SELECT `+quarantineColumns(`CASE WHEN $7 THEN NULL ELSE payload END`)+` FROM inbox_quarantine
		WHERE ($1 = '' OR consumer = $1) AND ($2 = '' OR kind = $2) AND ($3 OR resolved_at IS NULL)
			AND ($4 = '' OR failure_group = $4) AND id > $5
		ORDER BY id LIMIT $6`, schema.PlanEachTime, f.Consumer, f.Kind, f.Resolved, f.Group, f.After, f.Limit, f.WithoutPayloads)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing quarantine: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Quarantined, error) { return scanQuarantined(row) })
	if err != nil {
		return nil, fmt.Errorf("inbox: listing quarantine: %w", err)
	}
	return list, nil
}

// GetQuarantined returns one quarantined message, resolved or not.
func (adm *Admin) GetQuarantined(ctx context.Context, id int64) (Quarantined, error) {
	return getQuarantined(ctx, adm.pool, id)
}

func getQuarantined(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id int64) (Quarantined, error) {
	q, err := scanQuarantined(db.QueryRow(ctx, `SELECT `+quarantineColumns("payload")+` FROM inbox_quarantine WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return q, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return q, fmt.Errorf("inbox: reading quarantined message %d: %w", id, err)
	}
	return q, nil
}

// RedriveResult says what Retry did.
type RedriveResult struct {
	Quarantined      // the row, as it was before Redrive
	Redriven    bool // the message was written back to its topic
	Note        string
}

// Retry writes a dead-lettered message back, under its original
// message id, with its original payload, partition key and metadata, so the
// consumer (its handler fixed meanwhile) applies it: to the consumer's
// inbox.Config.RedriveTopic, naming the topic it came from (inbox.RedriveTopicMetadata),
// when its inbox.Inbox.Run recorded one, or else to the topic it came from.
// What is written is what the outbox can carry: a record that had no value
// goes back with an empty one, and headers that were not text go back as
// Metadata holds them (RawMetadata keeps them as they arrived).
// In one transaction it
//
//   - marks the quarantine row redriven (by whom, when),
//   - deletes the consumer's 'dead_lettered' inbox row, which would otherwise
//     suppress the message as a duplicate, and
//   - writes the message to the outbox (outbox.PublishTx) of the consumer's
//     database, whose relay publishes it.
//
// So a redrive happens exactly once or not at all: the message is published
// if and only if the redrive commits, and, carrying its original id, it is
// applied at most once per consumer even if published twice. Written back
// to the topic it came from, other consumers of that topic see a
// redelivery of a message they already applied, which their inboxes
// suppress; written to the consumer's redrive topic, nobody else sees it.
//
// Redriving a row that is already resolved, or a message the consumer
// applied meanwhile (its inbox row is 'processed'), changes nothing: the
// result has Redriven false and a Note that says why. Only dead letters can
// be redriven (ErrNotRedrivable otherwise): a payload conflict or an invalid
// message would only be quarantined again; Drop those.
func (adm *Admin) Retry(ctx context.Context, id int64, by string) (RedriveResult, error) {
	var res RedriveResult
	err := pgx.BeginFunc(ctx, adm.pool, func(tx pgx.Tx) (err error) {
		res, err = adm.RetryTx(ctx, tx, id, by)
		return err
	})
	if err != nil {
		return RedriveResult{}, err
	}
	return res, nil
}

// RetryTx is Retry in tx: the message is written back, and the action
// recorded in the history, if and only if tx commits.
func (adm *Admin) RetryTx(ctx context.Context, tx pgx.Tx, id int64, by string) (RedriveResult, error) {
	if strings.TrimSpace(by) == "" {
		return RedriveResult{}, errors.New("inbox: Retry needs the operator's name")
	}
	res, err := retry(ctx, tx, id, by)
	if err != nil || !res.Redriven {
		return res, err
	}
	return res, recordOne(ctx, tx, res.Quarantined, ActionRetry, by, "")
}

// retry is Retry's work in tx, without the history's record (a bulk
// action records its own).
func retry(ctx context.Context, tx pgx.Tx, id int64, by string) (RedriveResult, error) {
	q, err := scanQuarantined(tx.QueryRow(ctx, `SELECT `+quarantineColumns("payload")+` FROM inbox_quarantine WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return RedriveResult{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return RedriveResult{}, fmt.Errorf("inbox: reading quarantined message %d: %w", id, err)
	}
	res := RedriveResult{Quarantined: q}
	switch {
	case q.ResolvedAt != nil:
		res.Note = fmt.Sprintf("already %s by %s at %s; nothing done", q.Resolution, q.ResolvedBy, q.ResolvedAt.Format(time.RFC3339))
		return res, nil
	case q.Kind != inbox.KindDeadLetter:
		return RedriveResult{}, fmt.Errorf("%w: %d is a %s, which would only be quarantined again; discard it instead", ErrNotRedrivable, id, q.Kind)
	}
	parked, held, err := lockHoldOf(ctx, tx, q) // below
	if err != nil {
		return RedriveResult{}, err
	}
	status, applied, err := inboxRowOf(ctx, tx, q)
	if err != nil {
		return RedriveResult{}, err
	}
	if applied != "" {
		res.Note = applied
		return res, nil
	}
	switch _, err := uuid.Parse(q.MessageID); {
	case q.Topic == "":
		return RedriveResult{}, fmt.Errorf("%w: %d: the topic it came from is unknown", ErrNotRedrivable, id)
	case err != nil:
		return RedriveResult{}, fmt.Errorf("%w: %d: message id %q is not a UUID, which the outbox needs to keep it", ErrNotRedrivable, id, q.MessageID)
	}
	if res.Note, err = writeBack(ctx, tx, q, status, by); err != nil {
		return RedriveResult{}, err
	}
	if held {
		// The key stays held until the message, back, is applied; its
		// parked messages follow it then, in order.
		if err := setHoldOf(ctx, tx, q, schema.HoldRedriven); err != nil {
			return RedriveResult{}, err
		}
		res.Note += fmt.Sprintf("; the %d messages parked behind it on its key follow once it is applied", parked)
	}
	if _, err := tx.Exec(ctx, `UPDATE inbox_quarantine
		SET resolved_at = now(), resolution = $2, resolved_by = $3, resolution_note = $4 WHERE id = $1`,
		id, ResolutionRedriven, by, res.Note); err != nil {
		return RedriveResult{}, fmt.Errorf("inbox: marking %d redriven: %w", id, err)
	}
	res.Redriven = true
	return res, nil
}

// inboxRowOf locks the consumer's inbox row of q's message and returns its
// status ("" when there is none: swept by retention, or deduplication is
// off), and, when the message was applied after it was dead-lettered, a
// note that says so: there is nothing to redrive then.
func inboxRowOf(ctx context.Context, tx pgx.Tx, q Quarantined) (status, applied string, err error) {
	var processedAt time.Time
	err = tx.QueryRow(ctx, `SELECT status, processed_at FROM inbox_messages WHERE consumer = $1 AND message_id = $2 FOR UPDATE`,
		schema.PlanEachTime, q.Consumer, q.MessageID).Scan(&status, &processedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", "", nil
	case err != nil:
		return "", "", fmt.Errorf("inbox: reading inbox row: %w", err)
	case status == "processed":
		return status, fmt.Sprintf("message %s was applied by %s at %s, after it was dead-lettered; nothing done (discard the row to close it)",
			q.MessageID, q.Consumer, processedAt.Format(time.RFC3339)), nil
	}
	return status, "", nil
}

// writeBack clears what would suppress q's message when it comes back (its
// inbox row, of status, and its attempts) and writes it to the outbox, to
// the consumer's redrive topic or the one it came from; it returns what it
// did, for the row's note.
func writeBack(ctx context.Context, tx pgx.Tx, q Quarantined, status, by string) (string, error) {
	if status != "" {
		if _, err := tx.Exec(ctx, `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, schema.PlanEachTime, q.Consumer, q.MessageID); err != nil {
			return "", fmt.Errorf("inbox: clearing inbox row: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, q.Consumer, q.MessageID); err != nil {
		return "", fmt.Errorf("inbox: clearing attempts: %w", err)
	}
	msg := message.NewMessage(q.MessageID, q.Payload)
	for k, v := range q.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(inbox.RedriveOfMetadata, strconv.FormatInt(q.ID, 10))
	msg.Metadata.Set(inbox.RedriveByMetadata, by)
	to, err := redriveTopic(ctx, tx, q)
	if err != nil {
		return "", err
	}
	if to != q.Topic {
		msg.Metadata.Set(inbox.RedriveTopicMetadata, q.Topic)
	}
	if err := (outbox.Writer{Unnumbered: true}).PublishTx(ctx, tx, to, msg); err != nil { // a copy: its producer numbered it
		return "", err
	}
	note := fmt.Sprintf("message %s written back to %s through the outbox", q.MessageID, to)
	if to != q.Topic {
		note += fmt.Sprintf(" (the consumer's redrive topic; it came from %s)", q.Topic)
	}
	return note, nil
}

// redriveTopic is where q's consumer takes its redrives from: its
// inbox.Config.RedriveTopic as its inbox.Inbox.Run recorded it, or else the topic q
// came from.
func redriveTopic(ctx context.Context, tx pgx.Tx, q Quarantined) (string, error) {
	var to string
	err := tx.QueryRow(ctx, `SELECT redrive_topic FROM inbox_consumers WHERE consumer = $1`, q.Consumer).Scan(&to)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("inbox: reading the redrive topic of %s: %w", q.Consumer, err)
	}
	return cmp.Or(to, q.Topic), nil
}

// Drop closes a quarantined message without applying it, and keeps the
// audit record on its row: who, why, when. Redeliveries of a discarded dead
// letter stay suppressed. It returns ErrResolved for a row already redriven
// or discarded.
//
// A dead letter that holds its key (inbox.Config.OnDeadLetter = inbox.HoldKey) releases
// it in the same transaction: the first message parked behind it is written
// back to its topic through the outbox in its place, and the rest follow it
// once it is applied, as after a Retry (releaseDiscarded).
func (adm *Admin) Drop(ctx context.Context, id int64, by, why string) (Quarantined, error) {
	var q Quarantined
	err := pgx.BeginFunc(ctx, adm.pool, func(tx pgx.Tx) (err error) {
		q, err = adm.DropTx(ctx, tx, id, by, why)
		return err
	})
	return q, err
}

// DropTx is Drop in tx: the message is closed, its key released and the
// action recorded in the history if and only if tx commits.
func (adm *Admin) DropTx(ctx context.Context, tx pgx.Tx, id int64, by, why string) (Quarantined, error) {
	if strings.TrimSpace(by) == "" || strings.TrimSpace(why) == "" {
		return Quarantined{}, errors.New("inbox: Drop needs who drops it and why")
	}
	q, err := drop(ctx, tx, id, by, why)
	if errors.Is(err, pgx.ErrNoRows) {
		prior, gerr := getQuarantined(ctx, tx, id)
		if gerr != nil {
			return Quarantined{}, gerr
		}
		return prior, fmt.Errorf("%w: %d was %s by %s at %s", ErrResolved, id, prior.Resolution, prior.ResolvedBy, prior.ResolvedAt.Format(time.RFC3339))
	}
	if err == nil {
		err = recordOne(ctx, tx, q, ActionDrop, by, why)
	}
	if err != nil {
		return Quarantined{}, fmt.Errorf("inbox: discarding %d: %w", id, err)
	}
	return q, nil
}

// drop is Drop's work in tx, without the history's record:
// pgx.ErrNoRows when id is not open.
func drop(ctx context.Context, tx pgx.Tx, id int64, by, why string) (Quarantined, error) {
	q, err := scanQuarantined(tx.QueryRow(ctx, `UPDATE inbox_quarantine
		SET resolved_at = now(), resolution = $2, resolved_by = $3, resolution_note = $4
		WHERE id = $1 AND resolved_at IS NULL
		RETURNING `+quarantineColumns("payload"), id, ResolutionDiscarded, by, why))
	if err != nil {
		return q, err
	}
	return q, releaseDiscarded(ctx, tx, q) // below
}

// What the operator sees of, and does to, held keys (inbox.HoldKey, inbox hold.go).

// HeldKey is one key a consumer holds: a dead letter of it waits for an
// operator, and the key's later messages wait, parked, behind it.
type HeldKey struct {
	Consumer string
	Topic    string
	Key      string
	// Holder is the message the key waits for: the dead letter, or, once
	// redriven or after a Drop, the message written back in its place.
	Holder string
	// State is "held" (the holder is dead-lettered: redrive or discard
	// DeadLetter), "redriven" (written back, not applied yet) or "released"
	// (applied: the parked messages are being applied).
	State string
	// DeadLetter is the holder's open inbox_quarantine row, for Retry and
	// Drop (inboxctl redrive ID); 0 when none is open.
	DeadLetter   int64
	Parked       int        // messages parked behind the holder
	OldestParked *time.Time // when the first of them arrived; nil when none
	HeldAt       time.Time
}

// ListHeld lists the keys consumer holds ("": every consumer), oldest first.
func (adm *Admin) ListHeld(ctx context.Context, consumer string) ([]HeldKey, error) {
	rows, err := adm.pool.Query(ctx, `
		SELECT h.consumer, h.topic, h.partition_key, h.holder, h.state, h.held_at,
			coalesce((SELECT max(q.id) FROM inbox_quarantine q WHERE q.consumer = h.consumer AND q.message_id = h.holder
				AND q.kind = 'dead_letter' AND q.resolved_at IS NULL), 0),
			p.parked, p.oldest
		FROM inbox_held_keys h
		CROSS JOIN LATERAL (SELECT count(*)::int AS parked, min(parked_at) AS oldest FROM inbox_parked p
			WHERE p.consumer = h.consumer AND p.topic = h.topic AND p.partition_key = h.partition_key) p
		WHERE $1 = '' OR h.consumer = $1
		ORDER BY h.held_at, h.consumer, h.topic, h.partition_key`, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing held keys: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HeldKey, error) {
		var h HeldKey
		err := row.Scan(&h.Consumer, &h.Topic, &h.Key, &h.Holder, &h.State, &h.HeldAt, &h.DeadLetter, &h.Parked, &h.OldestParked)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: listing held keys: %w", err)
	}
	return list, nil
}

// HoldCounts is what a gauge shows of a consumer's holds.
type HoldCounts struct {
	Keys   int64 // keys held
	Parked int64 // messages parked behind them
}

// HoldStats counts consumer's held keys and parked messages: two index
// scans, for a metrics scrape.
func (adm *Admin) HoldStats(ctx context.Context, consumer string) (HoldCounts, error) {
	var c HoldCounts
	err := adm.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox_held_keys WHERE consumer = $1),
		(SELECT count(*) FROM inbox_parked WHERE consumer = $1)`, consumer).Scan(&c.Keys, &c.Parked)
	if err != nil {
		return c, fmt.Errorf("inbox: counting held keys: %w", err)
	}
	return c, nil
}

// lockHoldOf locks the hold the dead letter q holds, if any, and counts the
// messages parked behind it.
func lockHoldOf(ctx context.Context, tx pgx.Tx, q Quarantined) (parked int, held bool, err error) {
	if q.Kind != inbox.KindDeadLetter {
		return 0, false, nil // a conflicting copy of a holder's id holds nothing
	}
	var key string
	err = tx.QueryRow(ctx, `SELECT partition_key FROM inbox_held_keys
		WHERE consumer = $1 AND topic = $2 AND holder = $3 FOR UPDATE`, q.Consumer, q.Topic, q.MessageID).Scan(&key)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("inbox: reading the hold of %s: %w", q.MessageID, err)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM inbox_parked WHERE consumer = $1 AND topic = $2 AND partition_key = $3`,
		q.Consumer, q.Topic, key).Scan(&parked); err != nil {
		return 0, false, fmt.Errorf("inbox: counting parked messages: %w", err)
	}
	return parked, true, nil
}

// setHoldOf moves the hold q holds to state.
func setHoldOf(ctx context.Context, tx pgx.Tx, q Quarantined, state string) error {
	if _, err := tx.Exec(ctx, `UPDATE inbox_held_keys SET state = $4, updated_at = now()
		WHERE consumer = $1 AND topic = $2 AND holder = $3`, q.Consumer, q.Topic, q.MessageID, state); err != nil {
		return fmt.Errorf("inbox: marking the hold of %s %s: %w", q.MessageID, state, err)
	}
	return nil
}

// releaseDiscarded releases the key the discarded dead letter q held, in
// Drop's transaction. Nothing parked: the hold is deleted. Else the first
// parked message takes the dead letter's place, as if redriven: written back
// to its topic through the outbox under its own id (its inbox row deleted,
// so that it is applied when it comes back), and the hold waits for it; the
// others follow it once it is applied. The release goes through Kafka, like
// Retry's, because only the consumer has the handler. A first parked
// message whose id the outbox cannot carry (not a UUID) stays parked and
// the key is released at once: the key's next delivery applies the parked
// messages before itself.
func releaseDiscarded(ctx context.Context, tx pgx.Tx, q Quarantined) error {
	if _, held, err := lockHoldOf(ctx, tx, q); err != nil || !held {
		return err
	}
	var id, key string
	var payload []byte
	var md map[string]string
	err := tx.QueryRow(ctx, `SELECT p.message_id, p.partition_key, p.payload, p.metadata FROM inbox_parked p
		JOIN inbox_held_keys h USING (consumer, topic, partition_key)
		WHERE h.consumer = $1 AND h.topic = $2 AND h.holder = $3 ORDER BY p.seq LIMIT 1`,
		q.Consumer, q.Topic, q.MessageID).Scan(&id, &key, &payload, &md)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := tx.Exec(ctx, `DELETE FROM inbox_held_keys WHERE consumer = $1 AND topic = $2 AND holder = $3`,
			q.Consumer, q.Topic, q.MessageID); err != nil {
			return fmt.Errorf("inbox: releasing the key of %s: %w", q.MessageID, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("inbox: reading parked messages: %w", err)
	}
	if _, err := uuid.Parse(id); err != nil {
		return setHoldOf(ctx, tx, q, schema.HoldReleased)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'parked'`, schema.PlanEachTime, q.Consumer, id); err != nil {
		return fmt.Errorf("inbox: releasing parked message %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_parked WHERE consumer = $1 AND message_id = $2`, q.Consumer, id); err != nil {
		return fmt.Errorf("inbox: releasing parked message %s: %w", id, err)
	}
	msg := message.NewMessage(id, payload)
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(inbox.ReleaseOfMetadata, strconv.FormatInt(q.ID, 10))
	if err := (outbox.Writer{Unnumbered: true}).PublishTx(ctx, tx, q.Topic, msg); err != nil { // a copy: its producer numbered it
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE inbox_held_keys SET holder = $4, state = $5, updated_at = now()
		WHERE consumer = $1 AND topic = $2 AND holder = $3`, q.Consumer, q.Topic, q.MessageID, id, schema.HoldRedriven); err != nil {
		return fmt.Errorf("inbox: releasing the key of %s: %w", q.MessageID, err)
	}
	return nil
}
