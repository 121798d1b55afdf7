package outbox

import (
	"cmp"
	"context"
	"crypto/md5"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
)

// KeyMetadata is the metadata key that holds a message's partition key. The
// relay keeps it on the published message, and PartitionKey reads it back for
// watermill-kafka's partitioning marshaler, so every message with the same key
// lands on the same Kafka partition, in order.
const KeyMetadata = "partition_key"

// TypeMetadata is the metadata key a producer may keep an event's type in
// (msg.Metadata.Set(outbox.TypeMetadata, "OrderPaid")), so that a router, a
// tool or the consumer's inbox reads it without reading the payload. The
// relay publishes it as a header like any other metadata; the inbox
// refuses a message whose type header disagrees with its payload
// (inbox.Config.Envelope).
const TypeMetadata = "event_type"

// SequenceMetadata is the metadata key PublishTx numbers a message's place
// in its partition key's history under: "<stream>:<n>", the outbox's
// stream (a UUID drawn once per outbox, kept by its replicas and restores)
// and n, 1 for the first message written for the key, one more for each
// after, in commit order. A consumer that remembers each key's last number
// sees a gap (n skips: an event never reached it) or a rewind (n again,
// under an id it never saw: the producer's database went back in time);
// the inbox does (package inbox, continuity.go). signature.Sign covers it.
// PublishTx sets it on every message with a partition key, replacing one
// the message carries (copied from a consumed message, say), and removes it
// from the others (no key, or Writer.Unordered: no order to number;
// Writer.Unnumbered: a copy another outbox numbered).
const SequenceMetadata = "outbox_key_seq"

// One schema, one outbox. The outbox's tables live in the schema the pool's
// connections resolve first (their search_path: give the pool
// search_path=<schema> to keep several outboxes, or yours apart from a
// neighbour's, in one database; create the schema first), and so do its
// notification channel and advisory locks: both are derived from that
// schema's name (current_schema()), so relays and producers of two schemas
// never take each other's lead, wait on each other's keys or wake each
// other. The locks are two-part keys whose first half is one of the spaces
// below and whose second a hash of the schema (and of topic and key), so
// they cannot collide with one-part locks, nor with two-part ones of other
// first halves.
const (
	relayLockSpace  = 7_412_002 // the relay's lead (claimSQL)
	notifyLockSpace = 7_412_003 // the producer that notifies (PublishTx)
	keyLockSpace    = 7_412_004 // one partition key's writers (PublishTx)
	// shardSetupLockSpace serializes changes of the shard table (ensureShards).
	shardSetupLockSpace = 7_412_005
)

// NotifyChannel is the Postgres channel PublishTx notifies on commit in
// schema, so a listening relay of that schema wakes up at once instead of
// waiting for its next poll: "outbox_" and the MD5 of the schema's name
// (a channel name has at most 63 bytes; a schema name may have as many).
func NotifyChannel(schema string) string {
	sum := md5.Sum([]byte(schema))
	return "outbox_" + hex.EncodeToString(sum[:])
}

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the outbox's SQL migrations, for projects that run their
// own migration tool. Migrate applies them.
var Migrations, _ = fs.Sub(migrations, "migrations")

// Migrate creates or upgrades the outbox table. It is safe to call from
// several processes at once.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate.Apply(ctx, pool, "outbox", Migrations)
}

// NewMessage returns a message with a fresh UUIDv7 id (time-ordered, so ids
// sort roughly by creation) and the given partition key.
func NewMessage(key string, payload []byte) *message.Message {
	msg := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
	msg.Metadata.Set(KeyMetadata, key)
	return msg
}

// PartitionKey is a watermill-kafka GeneratePartitionKey: it returns the key
// that NewMessage (or the caller) stored in the message metadata.
func PartitionKey(_ string, msg *message.Message) (string, error) {
	return msg.Metadata.Get(KeyMetadata), nil
}

// DefaultMaxMessageBytes is the largest message, measured by RecordBytes,
// that PublishTx accepts and the relay sends, unless configured otherwise:
// Sarama's default Producer.MaxMessageBytes, a little under the broker's
// default max.message.bytes (1,048,588).
const DefaultMaxMessageBytes = 1_000_000

// ErrMessageTooLarge is wrapped by the error PublishTx returns for a message
// over the limit: no broker would take it, so it is refused before it
// becomes a row.
var ErrMessageTooLarge = errors.New("message too large")

// RecordBytes is the size of msg as the Kafka record the relay sends, as
// Sarama counts it against Producer.MaxMessageBytes: watermill-kafka's
// marshalers make the partition key the record key and every metadata entry,
// plus the message id, a header. Metadata that PublishTx adds (the write
// time, the trace context, the key's number) is not in msg yet; PublishTx
// counts it.
func RecordBytes(msg *message.Message) int {
	return recordBytes(msg.UUID, msg.Metadata, len(msg.Payload))
}

// uuidHeaderKey is the header watermill-kafka's marshalers carry the message
// id in (kafka.UUIDHeaderKey; pkg/outbox does not import watermill-kafka).
const uuidHeaderKey = "_watermill_message_uuid"

// sequenceHeaderBytes is what the SequenceMetadata header adds to a record
// at most: its key, a UUID, a colon and a 19-digit number, and two varint
// lengths.
const sequenceHeaderBytes = len(SequenceMetadata) + 36 + 1 + 19 + 2*binary.MaxVarintLen32

// recordBytes mirrors sarama.ProducerMessage.ByteSize for record batches
// (message format v2): a fixed maximum overhead per record, the key, the
// value, and each header's key and value with two varint lengths.
func recordBytes(id string, meta message.Metadata, payload int) int {
	const recordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1
	const headerOverhead = 2 * binary.MaxVarintLen32
	n := recordOverhead + len(meta[KeyMetadata]) + payload
	n += len(uuidHeaderKey) + len(id) + headerOverhead
	for k, v := range meta {
		n += len(k) + len(v) + headerOverhead
	}
	return n
}

// Writer writes messages as outbox rows. Its zero value is ready to use and
// is what the package-level PublishTx uses.
type Writer struct {
	// MaxMessageBytes is the largest message, measured by RecordBytes, that
	// PublishTx accepts: set it to the producer's Producer.MaxMessageBytes
	// (and keep the topic's max.message.bytes above it) when you change
	// that. Defaults to DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Unordered skips the per-key lock (see PublishTx): a key's messages
	// then reach Kafka in the order their rows were written, which is their
	// commit order only if the caller serializes a key's transactions itself
	// (by locking the entity's row first, say) or does not need the order.
	// Its messages carry no SequenceMetadata: there is no order to number.
	Unordered bool
	// Unnumbered writes the messages without SequenceMetadata, under the
	// key lock still: for copies of messages another outbox numbered, as a
	// consumer's inbox writes back a dead letter it redrives. Numbered
	// here, a copy would take a number of this outbox's key history, and
	// if its producer writes through the same outbox, one of the
	// producer's own: every consumer but the one that redrove it would
	// see a gap.
	Unnumbered bool
}

// PublishTx writes msgs to topic as outbox rows inside tx, with the default
// Writer. They are published if and only if tx commits. Each message keeps
// its UUID as its Kafka message id, so consumers can deduplicate; a message
// without a UUID gets a UUIDv7. A message over DefaultMaxMessageBytes is
// refused with an error wrapping ErrMessageTooLarge, and nothing is written.
func PublishTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	return Writer{}.PublishTx(ctx, tx, topic, msgs...)
}

// PublishTx is the package-level PublishTx with w's settings.
//
// Commit order per key: before it writes, PublishTx takes a transaction-
// scoped advisory lock per distinct (topic, partition key) of msgs, in a
// fixed order, so two transactions writing the same key take turns: the
// second waits until the first commits or rolls back, and its rows get
// higher ids. The relay publishes in id order, so one key's messages reach
// Kafka in the order their transactions committed, whatever locks the
// producers took. Messages with an empty key carry no order and take no
// lock. Like row locks, two transactions that write keys A then B and B
// then A can deadlock; Postgres aborts one of them (SQLSTATE 40P01), to be
// retried. Writer.Unordered skips the lock.
//
// Numbers per key: under the same lock, each keyed message gets the next
// number of its key's history (SequenceMetadata), from a counter row per
// (topic, key) in outbox_key_sequences that the transaction updates once
// per key. Numbers are taken in commit order and never twice: a gap or a
// repeat a consumer sees comes from elsewhere, or from this outbox's
// operators (a parked row dropped, a counter deleted by
// RelayConfig.KeySequenceRetention while a consumer still remembers the
// key). The numbering's update makes a key's second writer, when it runs
// under REPEATABLE READ or SERIALIZABLE, fail with a serialization error
// (SQLSTATE 40001) once the first commits: retry it, or write outbox rows
// at READ COMMITTED, as with any row two transactions update.
func (w Writer) PublishTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	if topic == "" {
		return errors.New("outbox: empty topic")
	}
	if len(msgs) == 0 {
		return nil
	}
	rows, err := w.encode(ctx, topic, msgs)
	if err != nil {
		return err
	}
	// One round trip (publishSQL): the keys' locks, their numbers, the rows
	// and the relay's wake-up, which Postgres delivers only if and when tx
	// commits.
	_, err = tx.Exec(ctx, publishSQL, topic, rows.ids, rows.keys, rows.payloads, rows.metas,
		notifyLockSpace, keyLockSpace, w.Unordered, w.Unnumbered)
	if err != nil {
		return fmt.Errorf("outbox: inserting %d rows: %w", len(msgs), err)
	}
	return nil
}

// outboxRows are messages as publishSQL takes them, a column each.
type outboxRows struct {
	ids      []uuid.UUID
	keys     []string
	payloads [][]byte
	metas    []string
}

// encode gives each message without one a UUIDv7, stamps its metadata
// (tracing.go), and refuses one over w's limit as a Kafka record.
func (w Writer) encode(ctx context.Context, topic string, msgs []*message.Message) (outboxRows, error) {
	limit := cmp.Or(w.MaxMessageBytes, DefaultMaxMessageBytes)
	r := outboxRows{make([]uuid.UUID, len(msgs)), make([]string, len(msgs)), make([][]byte, len(msgs)), make([]string, len(msgs))}
	for i, msg := range msgs {
		if msg.UUID == "" {
			msg.UUID = uuid.Must(uuid.NewV7()).String()
		}
		id, err := uuid.Parse(msg.UUID)
		if err != nil {
			return r, fmt.Errorf("outbox: message id %q is not a UUID: %w", msg.UUID, err)
		}
		stamped := stampedMetadata(ctx, msg.Metadata) // tracing.go: + outbox_created_at, traceparent
		delete(stamped, SequenceMetadata)             // publishSQL numbers the message, or leaves it unnumbered
		n := recordBytes(msg.UUID, stamped, len(msg.Payload))
		if msg.Metadata.Get(KeyMetadata) != "" && !w.Unordered && !w.Unnumbered {
			n += sequenceHeaderBytes
		}
		if n > limit {
			return r, fmt.Errorf("outbox: message %s to %s is %d bytes as a Kafka record (payload %d), over the %d-byte limit: %w",
				msg.UUID, topic, n, len(msg.Payload), limit, ErrMessageTooLarge)
		}
		meta, err := json.Marshal(stamped)
		if err != nil {
			return r, fmt.Errorf("outbox: encoding metadata: %w", err)
		}
		payload := msg.Payload
		if payload == nil {
			payload = []byte{} // pgx sends a nil slice as NULL; payload is NOT NULL
		}
		r.ids[i], r.keys[i], r.payloads[i], r.metas[i] = id, msg.Metadata.Get(KeyMetadata), payload, string(meta)
	}
	return r, nil
}

// publishSQL writes a transaction's messages to one topic in four steps,
// one statement: $1 the topic; $2..$5 the rows' ids, keys, payloads and
// metadata; $6 and $7 the advisory lock spaces of the wake-up and the keys;
// $8 Writer.Unordered, $9 Writer.Unnumbered.
//
//  1. locked: a transaction-scoped lock per distinct key, in a fixed order,
//     so a key's writers take turns and its ids follow commit order;
//  2. numbered: each key's counter advances by its count of messages, in
//     one upsert; it reads locked (an uncorrelated subquery, run once
//     before the first row is written), so numbers are taken only once
//     every lock is held;
//  3. rows: the outbox rows, a keyed message's metadata carrying its number
//     (SequenceMetadata: the numbers up to the counter's new value, in the
//     order given);
//  4. the wake-up: a transaction that notifies holds a cluster-wide lock
//     from its commit until its commit record is flushed, so if every
//     producer notified, commits would queue behind each other's fsync
//     instead of sharing one (measured here: "COMMIT waiting" on every
//     backend). Only the one transaction at a time that holds a try-lock
//     notifies; the others commit freely. A row committed just after that
//     notification was consumed is picked up by the relay's short
//     follow-up polls (see Relay.Run), or, at worst, by its regular poll.
const publishSQL = `
	WITH locked AS MATERIALIZED (
		SELECT count(pg_advisory_xact_lock($7, h)) AS n
		FROM (SELECT DISTINCT hashtext(current_schema() || E'\n' || $1 || E'\n' || k) AS h
		      FROM unnest($3::text[]) AS k WHERE k <> '' AND NOT $8 ORDER BY 1) AS keys
	), numbered AS (
		INSERT INTO outbox_key_sequences AS s (topic, partition_key, seq)
		SELECT $1, k, count(*) FROM unnest($3::text[]) AS k
		WHERE k <> '' AND NOT $8 AND NOT $9 AND (SELECT n FROM locked) >= 0
		GROUP BY k ORDER BY k
		ON CONFLICT (topic, partition_key) DO UPDATE SET seq = s.seq + EXCLUDED.seq,
			-- hourly: an update that leaves the indexed touched_at alone writes no index
			touched_at = CASE WHEN s.touched_at < now() - interval '1 hour' THEN now() ELSE s.touched_at END
		RETURNING partition_key, seq
	), rows AS (
		INSERT INTO outbox_messages (message_id, topic, partition_key, payload, metadata)
		SELECT m.id, $1, m.key, m.payload, CASE WHEN c.seq IS NULL THEN m.meta
			ELSE m.meta || jsonb_build_object('` + SequenceMetadata + `', (SELECT id FROM outbox_stream)::text || ':' ||
				(c.seq - count(*) OVER (PARTITION BY m.key) + row_number() OVER (PARTITION BY m.key ORDER BY m.ord)))
			END
		FROM unnest($2::uuid[], $3::text[], $4::bytea[], $5::jsonb[]) WITH ORDINALITY AS m(id, key, payload, meta, ord)
		LEFT JOIN numbered c ON c.partition_key = m.key
		WHERE (SELECT n FROM locked) >= 0
		ORDER BY m.ord
	)
	SELECT CASE WHEN pg_try_advisory_xact_lock($6, hashtext(current_schema()))
		THEN pg_notify('outbox_' || md5(current_schema()), '') END`
