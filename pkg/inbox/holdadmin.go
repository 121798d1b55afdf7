package inbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// What the operator sees of, and does to, held keys (HoldKey, hold.go).

// HeldKey is one key a consumer holds: a dead letter of it waits for an
// operator, and the key's later messages wait, parked, behind it.
type HeldKey struct {
	Consumer string
	Topic    string
	Key      string
	// Holder is the message the key waits for: the dead letter, or, once
	// redriven or after a DropQuarantined, the message written back in its place.
	Holder string
	// State is "held" (the holder is dead-lettered: redrive or discard
	// DeadLetter), "redriven" (written back, not applied yet) or "released"
	// (applied: the parked messages are being applied).
	State string
	// DeadLetter is the holder's open inbox_quarantine row, for RetryQuarantined and
	// DropQuarantined (inboxctl redrive ID); 0 when none is open.
	DeadLetter   int64
	Parked       int        // messages parked behind the holder
	OldestParked *time.Time // when the first of them arrived; nil when none
	HeldAt       time.Time
}

// ListHeld lists the keys consumer holds ("": every consumer), oldest first.
func ListHeld(ctx context.Context, pool *pgxpool.Pool, consumer string) ([]HeldKey, error) {
	rows, err := pool.Query(ctx, `
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

// ReadHoldStats counts consumer's held keys and parked messages: two index
// scans, for a metrics scrape.
func ReadHoldStats(ctx context.Context, pool *pgxpool.Pool, consumer string) (HoldCounts, error) {
	var c HoldCounts
	err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM inbox_held_keys WHERE consumer = $1),
		(SELECT count(*) FROM inbox_parked WHERE consumer = $1)`, consumer).Scan(&c.Keys, &c.Parked)
	if err != nil {
		return c, fmt.Errorf("inbox: counting held keys: %w", err)
	}
	return c, nil
}

// lockHoldOf locks the hold the dead letter q holds, if any, and counts the
// messages parked behind it.
func lockHoldOf(ctx context.Context, tx pgx.Tx, q Quarantined) (parked int, held bool, err error) {
	if q.Kind != KindDeadLetter {
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
// DropQuarantined's transaction. Nothing parked: the hold is deleted. Else the first
// parked message takes the dead letter's place, as if redriven: written back
// to its topic through the outbox under its own id (its inbox row deleted,
// so that it is applied when it comes back), and the hold waits for it; the
// others follow it once it is applied. The release goes through Kafka, like
// RetryQuarantined's, because only the consumer has the handler. A first parked
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
		return setHoldOf(ctx, tx, q, holdReleased)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_messages WHERE consumer = $1 AND message_id = $2 AND status = 'parked'`, q.Consumer, id); err != nil {
		return fmt.Errorf("inbox: releasing parked message %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_parked WHERE consumer = $1 AND message_id = $2`, q.Consumer, id); err != nil {
		return fmt.Errorf("inbox: releasing parked message %s: %w", id, err)
	}
	msg := message.NewMessage(id, payload)
	for k, v := range md {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(ReleaseOfMetadata, strconv.FormatInt(q.ID, 10))
	if err := outbox.PublishTx(ctx, tx, q.Topic, msg); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `UPDATE inbox_held_keys SET holder = $4, state = $5, updated_at = now()
		WHERE consumer = $1 AND topic = $2 AND holder = $3`, q.Consumer, q.Topic, q.MessageID, id, holdRedriven); err != nil {
		return fmt.Errorf("inbox: releasing the key of %s: %w", q.MessageID, err)
	}
	return nil
}
