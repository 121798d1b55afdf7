package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxref/outbox-inbox/pkg/internal/permanent"
)

// Parking. A row the broker will never accept, however often it is sent
// (larger than the producer's or the topic's limit, a record the broker
// calls invalid), is parked by the relay: it stays unpublished with its
// reason, and the rest of its batch is published. The rows after it with
// the same topic and partition key wait behind it, so that a key's messages
// never overtake each other; other keys go on. An operator lists parked
// rows (Parked), and either retries one (Retry: after raising the broker's
// limit, say), which lets its key go on behind it, or drops it (Drop), which
// moves it to outbox_dropped with who and why, and lets its key go on
// without it. Rows with an empty partition key carry no order, so nothing
// waits behind them.

// Permanent wraps err so that the relay's default IsPermanent takes it as a
// refusal of the message itself: a publisher's way to say "never send this
// again" (outboxkafka's Publisher wraps Kafka's refusals in it). It is the
// inbox's inbox.Permanent too: one kind, a failure that trying again cannot
// fix. nil stays nil.
func Permanent(err error) error { return permanent.Wrap(err) }

// IsPermanent reports whether err, from a Publisher, says the broker will
// never take a message of the batch, so that the relay finds that message
// and parks it instead of retrying the batch: whether err was wrapped by
// Permanent (or by inbox.Permanent). Everything else is transient, and the batch is retried after a
// backoff. It is RelayConfig.IsPermanent's default; outboxkafka.IsPermanent
// also knows Sarama's refusals, for a relay publishing through
// watermill-kafka's Publisher.
func IsPermanent(err error) bool { return permanent.Is(err) }

// ParkedRow is a parked outbox row.
type ParkedRow struct {
	ID        int64 // the outbox row's id: what Retry and Drop take
	MessageID string
	Topic     string
	Key       string // the partition key
	Payload   []byte
	Metadata  message.Metadata
	CreatedAt time.Time
	ParkedAt  time.Time
	Reason    string
	Waiting   int // rows of the same topic and key waiting behind it
}

// ErrNotParked is returned by RetryParked and DropParked for an id that is not a parked
// row (never was, or already retried or dropped).
var ErrNotParked = errors.New("outbox: no parked row with that id")

// ListParked lists the parked rows, oldest first.
func ListParked(ctx context.Context, pool *pgxpool.Pool) ([]ParkedRow, error) {
	return ListParkedPage(ctx, pool, 0, 0)
}

// ListParkedPage lists at most limit parked rows after id after, oldest
// first (limit 0: all of them): a page of a long list.
func ListParkedPage(ctx context.Context, pool *pgxpool.Pool, after int64, limit int) ([]ParkedRow, error) {
	rows, err := pool.Query(ctx, `
		SELECT p.id, p.message_id::text, p.topic, p.partition_key, p.payload, p.metadata,
		       p.created_at, p.parked_at, p.park_reason,
		       CASE WHEN p.partition_key = '' THEN 0 ELSE (
		           SELECT count(*) FROM outbox_messages w
		           WHERE w.published_at IS NULL AND w.parked_at IS NULL
		             AND w.topic = p.topic AND w.partition_key = p.partition_key AND w.id > p.id) END
		FROM outbox_messages p
		WHERE p.parked_at IS NOT NULL AND p.id > $1
		ORDER BY p.id LIMIT nullif($2, 0)`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: listing parked rows: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedRow, error) {
		var p ParkedRow
		var meta []byte
		err := row.Scan(&p.ID, &p.MessageID, &p.Topic, &p.Key, &p.Payload, &meta,
			&p.CreatedAt, &p.ParkedAt, &p.Reason, &p.Waiting)
		if err == nil {
			err = json.Unmarshal(meta, &p.Metadata)
		}
		return p, err
	})
}

// RetryParked unparks row id: the relay sends it again with the next batch, and
// its key's waiting rows go out after it. Fix what refused it first (the
// broker's max.message.bytes, the producer's limit), or it is parked again.
func RetryParked(ctx context.Context, pool *pgxpool.Pool, id int64) error {
	return retryParked(ctx, pool, id)
}

// RetryParkedTx is RetryParked in tx: for a caller that records what it
// did in the same transaction (inbox.RunBulk).
func RetryParkedTx(ctx context.Context, tx pgx.Tx, id int64) error { return retryParked(ctx, tx, id) }

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func retryParked(ctx context.Context, db execer, id int64) error {
	tag, err := db.Exec(ctx, `
		UPDATE outbox_messages SET parked_at = NULL, park_reason = NULL
		WHERE id = $1 AND parked_at IS NOT NULL`, id)
	if err != nil {
		return fmt.Errorf("outbox: retrying row %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrNotParked, id)
	}
	return nil
}

// DropParked gives up on parked row id: it moves to outbox_dropped with by, why
// and the time, and its key's waiting rows go out without it. Consumers
// never see the message, and its number is missing from its key's history:
// the next message of the key shows them a gap (inbox continuity, alert
// InboxGap); why should say what was done instead.
func DropParked(ctx context.Context, pool *pgxpool.Pool, id int64, by, why string) error {
	return dropParked(ctx, pool, id, by, why)
}

// DropParkedTx is DropParked in tx.
func DropParkedTx(ctx context.Context, tx pgx.Tx, id int64, by, why string) error {
	return dropParked(ctx, tx, id, by, why)
}

func dropParked(ctx context.Context, db execer, id int64, by, why string) error {
	if strings.TrimSpace(by) == "" || strings.TrimSpace(why) == "" {
		return errors.New("outbox: DropParked needs who drops the row and why: they are its audit record")
	}
	tag, err := db.Exec(ctx, `
		WITH gone AS (
			DELETE FROM outbox_messages WHERE id = $1 AND parked_at IS NOT NULL
			RETURNING id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason)
		INSERT INTO outbox_dropped (id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason, dropped_by, drop_reason)
		SELECT id, message_id, topic, partition_key, payload, metadata, created_at, parked_at, park_reason, $2, $3 FROM gone`,
		id, by, why)
	if err != nil {
		return fmt.Errorf("outbox: dropping row %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %d", ErrNotParked, id)
	}
	return nil
}
