package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// Continuity: what a consumer can tell from what it received about what it
// did not. A producer's PublishTx numbers each key's messages
// (outbox.SequenceMetadata: the key's stream and n, from 1, in commit
// order) and its signature covers the number. The inbox keeps, per
// consumer, topic, key and stream, the last number it took in, and checks
// every message new to it (its inbox row just written: applied, parked or
// dead-lettered) in the same transaction:
//
//   - n = last + 1, or a stream it has no state for: in order;
//   - n > last + 1: a gap, n - last - 1 of the key's messages never reached
//     it (a relay that marked rows sent without sending them, records lost
//     by the broker, an offset moved past them, or messages quarantined as
//     invalid, which do not count as taken in);
//   - n <= last: a rewind, the producer numbered again what it had numbered
//     before under an id this consumer never saw: its database went back in
//     time (a failover that lost committed transactions, a restore), so
//     what the consumer applied from the lost history the producer no
//     longer has.
//
// Either way the message is handled as it would be (the breach is not the
// message's fault), the breach is written to inbox_continuity_breaches and
// logged, and the state moves to the message's number, so one breach is
// reported once. A redelivery is the inbox's (a duplicate), never a breach;
// a redriven dead letter comes back from the consumer's own outbox, under
// its stream, not the producer's. Messages without a number (another
// producer, or one without a key) are not checked. The state of a key not
// heard from within Config.Retention is swept; its next message starts
// afresh. The producer must remember a key longer than that
// (outbox.RelayConfig.KeySequenceRetention, 30 days by default): a key it
// forgot starts again at 1, a rewind to a consumer that still remembers it.

// BreachKind is the kind of a continuity breach.
type BreachKind string

// The kinds of breach.
const (
	Gap    BreachKind = "gap"
	Rewind BreachKind = "rewind"
)

// Breach is one continuity breach, seen on message MessageID: Expected was
// the number due after PreviousID's, Got is the number it carried.
type Breach struct {
	Consumer   string
	Kind       BreachKind
	Topic      string
	Key        string
	Stream     string
	Expected   int64
	Got        int64
	MessageID  string
	PreviousID string
	DetectedAt time.Time
}

// String says what the breach means, for logs.
func (b Breach) String() string {
	if b.Kind == Gap {
		return fmt.Sprintf("gap on key %q of %s: got number %d, %d expected; %d of the key's messages never arrived (after %s)",
			clip(b.Key), b.Topic, b.Got, b.Expected, b.Got-b.Expected, b.PreviousID)
	}
	return fmt.Sprintf("rewind on key %q of %s: got number %d again under an id never seen, %d expected; the producer's history went back (after %s)",
		clip(b.Key), b.Topic, b.Got, b.Expected, b.PreviousID)
}

// keySeq is a delivery's place in its key's history.
type keySeq struct {
	key    string // as stored (storedKey)
	stream string
	n      int64
}

// readSequence reads msg's outbox.SequenceMetadata, if it has one. A value
// that is not "<uuid>:<n>" (n from 1) is a producer's bug, refused.
func readSequence(msg *message.Message) (*keySeq, error) {
	v, ok := msg.Metadata[outbox.SequenceMetadata]
	if !ok {
		return nil, nil
	}
	stream, num, ok := strings.Cut(v, ":")
	if !ok {
		return nil, fmt.Errorf("%s header %q is not <stream>:<number>", outbox.SequenceMetadata, clip(v))
	}
	id, err := uuid.Parse(stream)
	if err != nil {
		return nil, fmt.Errorf("%s header %q: the stream is not a UUID", outbox.SequenceMetadata, clip(v))
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 {
		return nil, fmt.Errorf("%s header %q: the number is not a positive integer", outbox.SequenceMetadata, clip(v))
	}
	return &keySeq{stream: id.String(), n: n}, nil
}

// checkContinuity checks the numbered deliveries of ds[fresh], new to the
// consumer, in arrival order, against the key's state, in tx: it writes the
// breaches, moves the state, and keeps each delivery's breaches for settle
// (the others' are cleared: an attempt that rolled back leaves none).
func (in *Inbox) checkContinuity(ctx context.Context, tx pgx.Tx, ds []*delivery, fresh []int) error {
	var topics, keys, streams, ids []string
	var nums []int64
	var of []*delivery
	for _, d := range ds {
		d.breaches = nil
	}
	for _, i := range fresh {
		if d := ds[i]; d.seq != nil {
			topics, keys, streams, ids = append(topics, d.topic), append(keys, d.seq.key), append(streams, d.seq.stream), append(ids, d.id)
			nums = append(nums, d.seq.n)
			of = append(of, d)
		}
	}
	if len(of) == 0 {
		return nil
	}
	var rows pgx.Rows
	var err error
	if len(of) == 1 {
		// One message, as most deliveries are: its key's row read and
		// locked by primary key, moved, and the breach written, in a
		// statement cheap to plan (the batch's below costs more to plan
		// than to run).
		rows, err = tx.Query(ctx, `
			WITH prev AS (
				SELECT seq, message_id FROM inbox_key_sequences
				WHERE consumer = $1 AND topic = $2 AND partition_key = $3 AND stream = $4
				FOR UPDATE
			), moved AS (
				INSERT INTO inbox_key_sequences AS s (consumer, topic, partition_key, stream, seq, message_id)
				VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (consumer, topic, partition_key, stream) DO UPDATE
				SET seq = EXCLUDED.seq, message_id = EXCLUDED.message_id, touched_at = `+touchedAt+`
			)
			INSERT INTO inbox_continuity_breaches (consumer, kind, topic, partition_key, stream, expected, got, message_id, previous_id)
			SELECT $1, CASE WHEN $5 > p.seq + 1 THEN 'gap' ELSE 'rewind' END, $2, $3, $4, p.seq + 1, $5, $6, p.message_id
			FROM prev p WHERE $5 <> p.seq + 1
			RETURNING consumer, kind, topic, partition_key, stream::text, expected, got, message_id, previous_id, detected_at`,
			in.cfg.Consumer, topics[0], keys[0], streams[0], nums[0], ids[0])
		return in.collectBreaches(rows, err, of)
	}
	// The state's rows are locked first (FOR UPDATE), then each message is
	// compared with the one before it: its key's previous message in this
	// batch, or the state. The state moves to each key's last message.
	rows, err = tx.Query(ctx, `
		WITH m AS (
			SELECT * FROM unnest($2::text[], $3::text[], $4::uuid[], $5::bigint[], $6::text[])
				WITH ORDINALITY AS m(topic, key, stream, n, id, ord)
		), prev AS (
			-- each key's row by its primary key, locked in key order
			SELECT p.* FROM (SELECT DISTINCT topic, key, stream FROM m ORDER BY 1, 2, 3) AS g,
			LATERAL (SELECT s.topic, s.partition_key, s.stream, s.seq, s.message_id FROM inbox_key_sequences s
				WHERE s.consumer = $1 AND s.topic = g.topic AND s.partition_key = g.key AND s.stream = g.stream
				FOR UPDATE) AS p
		), chk AS (
			SELECT m.*,
				coalesce(lag(m.n) OVER w, p.seq) AS before,
				coalesce(lag(m.id) OVER w, p.message_id) AS before_id,
				row_number() OVER (PARTITION BY m.topic, m.key, m.stream ORDER BY m.ord DESC) AS from_last
			FROM m LEFT JOIN prev p ON p.topic = m.topic AND p.partition_key = m.key AND p.stream = m.stream
			WINDOW w AS (PARTITION BY m.topic, m.key, m.stream ORDER BY m.ord)
		), moved AS (
			INSERT INTO inbox_key_sequences AS s (consumer, topic, partition_key, stream, seq, message_id)
			SELECT $1, topic, key, stream, n, id FROM chk WHERE from_last = 1
			ORDER BY topic, key, stream
			ON CONFLICT (consumer, topic, partition_key, stream) DO UPDATE
			SET seq = EXCLUDED.seq, message_id = EXCLUDED.message_id, touched_at = `+touchedAt+`
		), breached AS (
			INSERT INTO inbox_continuity_breaches (consumer, kind, topic, partition_key, stream, expected, got, message_id, previous_id)
			SELECT $1, CASE WHEN n > before + 1 THEN 'gap' ELSE 'rewind' END, topic, key, stream, before + 1, n, id, before_id
			FROM chk WHERE n <> before + 1
			RETURNING consumer, kind, topic, partition_key, stream::text, expected, got, message_id, previous_id, detected_at
		)
		SELECT * FROM breached`, in.cfg.Consumer, topics, keys, streams, nums, ids)
	return in.collectBreaches(rows, err, of)
}

// touchedAt moves a key's touched_at (which only the sweep reads, through
// an index) once an hour at most: an update that leaves every indexed
// column as it was can be a heap-only tuple, which writes no index.
const touchedAt = `CASE WHEN s.touched_at < now() - interval '1 hour' THEN now() ELSE s.touched_at END`

// collectBreaches reads the breaches a continuity check wrote and keeps
// each on the delivery that showed it.
func (in *Inbox) collectBreaches(rows pgx.Rows, err error, of []*delivery) error {
	if err != nil {
		return fmt.Errorf("inbox: checking continuity: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Breach])
	if err != nil {
		return fmt.Errorf("inbox: checking continuity: %w", err)
	}
	for _, b := range found {
		for _, d := range of {
			if d.id == b.MessageID {
				d.breaches = append(d.breaches, b)
			}
		}
	}
	return nil
}

// ContinuityCounts counts a consumer's breaches by kind, since its first.
type ContinuityCounts struct {
	Gaps, Rewinds int64
}

// ReadContinuity counts consumer's continuity breaches, for metrics.
func ReadContinuity(ctx context.Context, pool *pgxpool.Pool, consumer string) (ContinuityCounts, error) {
	var c ContinuityCounts
	err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE kind = 'gap'), count(*) FILTER (WHERE kind = 'rewind')
		FROM inbox_continuity_breaches WHERE consumer = $1`, consumer).Scan(&c.Gaps, &c.Rewinds)
	if err != nil {
		return c, fmt.Errorf("inbox: counting continuity breaches: %w", err)
	}
	return c, nil
}

// ListBreaches returns the last limit continuity breaches of consumer (of
// every consumer when it is ""), newest first.
func ListBreaches(ctx context.Context, pool *pgxpool.Pool, consumer string, limit int) ([]Breach, error) {
	if limit <= 0 {
		return nil, errors.New("inbox: ListBreaches needs a positive limit")
	}
	rows, err := pool.Query(ctx, `
		SELECT consumer, kind, topic, partition_key, stream::text, expected, got, message_id, previous_id, detected_at
		FROM inbox_continuity_breaches WHERE $1 = '' OR consumer = $1 ORDER BY id DESC LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing continuity breaches: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Breach])
}
