package inbox

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

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
//   - n > last + 1: a gap, n - last - 1 of the key's messages had not
//     reached it (a relay that marked rows sent without sending them,
//     records lost by the broker, an offset moved past them, a row dropped
//     from the producer's outbox, or messages quarantined as invalid, which
//     do not count as taken in); their numbers are remembered as missing;
//   - n <= last, a number remembered missing: late, filling its gap (a row
//     sent again by hand, a key moved to another partition); recorded, not
//     alarmed: its gap was;
//   - any other n <= last, under an id this consumer has no inbox row for:
//     a rewind, the producer numbered again what it had numbered before:
//     its database went back in time (a failover that lost committed
//     transactions, a restore), so what the consumer applied from the lost
//     history the producer no longer has.
//
// Either way the message is handled as it would be (the breach is not the
// message's fault), the breach is written to inbox_continuity_breaches and
// logged; the highest number never goes back, so the messages after a late
// one or a rewind meet the history as it was. A redelivery is the inbox's
// (a duplicate), never a breach; a redriven dead letter comes back
// unnumbered (outbox.Writer.Unnumbered), as do messages without a key or
// of another producer: they are not checked. The state of a key not
// heard from within Config.Retention is swept; its next message starts
// afresh. The producer must remember a key longer than that
// (outbox.RelayConfig.KeySequenceRetention, 30 days by default): a key it
// forgot starts again at 1, a rewind to a consumer that still remembers it.

// numbered is the stage (stages.go) that reads d's place in its key's
// history, after Verify, which covers it.
func numbered(in *Inbox, d *delivery) string {
	seq, err := readSequence(d.msg)
	if err != nil {
		return err.Error()
	}
	if seq != nil {
		seq.key = storedKey(in.cfg.Key(d.msg))
		d.seq = seq
	}
	return ""
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

// continuitySQL checks one message ($5, its number; $6, its id) of a key
// ($2 topic, $3 key, $4 stream) against the key's state, whose row it reads
// and locks by primary key, and moves the state:
//
//   - no state, or the next number: in order;
//   - past the next: a gap, its numbers remembered as missing;
//   - a number remembered missing: late (it fills its gap; recorded, not a
//     breach an alert pages for);
//   - any other number at or below the last: a rewind.
//
// The last number never goes back, so a late message or a rewind is
// reported once and the messages after it meet the history as it was.
const continuitySQL = `
	WITH prev AS (
		SELECT seq, missing, message_id FROM inbox_key_sequences
		WHERE consumer = $1 AND topic = $2 AND partition_key = $3 AND stream = $4
		FOR UPDATE
	), kind AS (
		SELECT CASE WHEN $5 = seq + 1 THEN NULL
			WHEN $5 > seq + 1 THEN 'gap'
			WHEN missing @> $5::bigint THEN 'late'
			ELSE 'rewind' END AS kind, seq, message_id
		FROM prev
	), moved AS (
		INSERT INTO inbox_key_sequences AS s (consumer, topic, partition_key, stream, seq, message_id)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (consumer, topic, partition_key, stream) DO UPDATE SET
			missing = CASE WHEN EXCLUDED.seq > s.seq + 1 THEN s.missing + int8multirange(int8range(s.seq + 1, EXCLUDED.seq))
				WHEN EXCLUDED.seq <= s.seq THEN s.missing - int8multirange(int8range(EXCLUDED.seq, EXCLUDED.seq + 1))
				ELSE s.missing END,
			message_id = CASE WHEN EXCLUDED.seq > s.seq THEN EXCLUDED.message_id ELSE s.message_id END,
			seq = greatest(s.seq, EXCLUDED.seq),
			touched_at = ` + touchedAt + `
	)
	INSERT INTO inbox_continuity_breaches (consumer, kind, topic, partition_key, stream, expected, got, message_id, previous_id)
	SELECT $1, kind, $2, $3, $4, seq + 1, $5, $6, message_id FROM kind WHERE kind IS NOT NULL
	RETURNING consumer, kind, topic, partition_key, stream::text, expected, got, message_id, previous_id, detected_at`

// touchedAt moves a key's touched_at (which only the sweep reads, through
// an index) once an hour at most: an update that leaves every indexed
// column as it was can be a heap-only tuple, which writes no index.
const touchedAt = `CASE WHEN s.touched_at < now() - interval '1 hour' THEN now() ELSE s.touched_at END`
