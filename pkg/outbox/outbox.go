package outbox

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/internal/migrate"
)

// KeyMetadata is the metadata key that holds a message's partition key. The
// relay keeps it on the published message, and PartitionKey reads it back for
// watermill-kafka's partitioning marshaler, so every message with the same key
// lands on the same Kafka partition, in order.
const KeyMetadata = "partition_key"

// NotifyChannel is the Postgres channel PublishTx notifies on commit, so a
// listening relay wakes up at once instead of waiting for its next poll.
const NotifyChannel = "outbox_messages"

// notifyLockKey gates the notification: see PublishTx.
const notifyLockKey = 7_412_003

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

// PublishTx writes msgs to topic as outbox rows inside tx. They are published
// if and only if tx commits. Each message keeps its UUID as its Kafka message
// id, so consumers can deduplicate; a message without a UUID gets a UUIDv7.
func PublishTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	if topic == "" {
		return errors.New("outbox: empty topic")
	}
	if len(msgs) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(msgs))
	keys := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	metas := make([]string, len(msgs))
	for i, msg := range msgs {
		if msg.UUID == "" {
			msg.UUID = uuid.Must(uuid.NewV7()).String()
		}
		id, err := uuid.Parse(msg.UUID)
		if err != nil {
			return fmt.Errorf("outbox: message id %q is not a UUID: %w", msg.UUID, err)
		}
		meta, err := json.Marshal(stampedMetadata(ctx, msg.Metadata)) // tracing.go: + outbox_created_at, traceparent
		if err != nil {
			return fmt.Errorf("outbox: encoding metadata: %w", err)
		}
		payload := msg.Payload
		if payload == nil {
			payload = []byte{} // pgx sends a nil slice as NULL; payload is NOT NULL
		}
		ids[i], keys[i], payloads[i], metas[i] = id, msg.Metadata.Get(KeyMetadata), payload, string(meta)
	}
	// One round trip: insert every row and queue the wake-up notification,
	// which Postgres delivers only if and when tx commits.
	//
	// A transaction that notifies holds a cluster-wide lock from its commit
	// until its commit record is flushed, so if every producer notified,
	// commits would queue behind each other's fsync instead of sharing one
	// (measured here: "COMMIT waiting" on every backend). Only the one
	// transaction at a time that holds a try-lock notifies; the others
	// commit freely. A row committed just after that notification was
	// consumed is picked up by the relay's short follow-up polls (see
	// Relay.Run), or, at worst, by its regular poll.
	_, err := tx.Exec(ctx, `
		WITH rows AS (
			INSERT INTO outbox_messages (message_id, topic, partition_key, payload, metadata)
			SELECT m.id, $1, m.key, m.payload, m.meta
			FROM unnest($2::uuid[], $3::text[], $4::bytea[], $5::jsonb[]) AS m(id, key, payload, meta)
		)
		SELECT CASE WHEN pg_try_advisory_xact_lock($7) THEN pg_notify($6, '') END`,
		topic, ids, keys, payloads, metas, NotifyChannel, notifyLockKey)
	if err != nil {
		return fmt.Errorf("outbox: inserting %d rows: %w", len(msgs), err)
	}
	return nil
}
