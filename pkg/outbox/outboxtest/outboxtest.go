// Package outboxtest helps a service's own tests check what its
// transactions put in the outbox, with no relay and no Kafka: the rows a
// transaction wrote are the messages the relay will publish if, and only
// if, it commits.
//
//	tx, _ := pool.Begin(ctx)
//	payOrder(ctx, tx, id)                               // the code under test
//	outboxtest.RequirePublished(t, tx, "orders.events", func(m *message.Message) bool {
//		return strings.Contains(string(m.Payload), id)
//	})
package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Querier is what Pending reads through: a pgx.Tx (what the transaction
// wrote so far), a *pgxpool.Pool or a *pgx.Conn (what committed).
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Pending returns the messages to topic that are in the outbox and not yet
// published, oldest first, as q sees them: each with its id, payload and
// metadata (the partition key in outbox.KeyMetadata, and what PublishTx
// stamps: the row's creation time, a trace context).
func Pending(ctx context.Context, q Querier, topic string) ([]*message.Message, error) {
	rows, err := q.Query(ctx, `SELECT message_id::text, payload, metadata FROM outbox_messages
		WHERE topic = $1 AND published_at IS NULL ORDER BY id`, topic)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: reading the outbox: %w", err)
	}
	defer rows.Close()
	var out []*message.Message
	for rows.Next() {
		var (
			id      string
			payload []byte
			meta    []byte
		)
		if err := rows.Scan(&id, &payload, &meta); err != nil {
			return nil, fmt.Errorf("outboxtest: reading the outbox: %w", err)
		}
		msg := message.NewMessage(id, payload)
		if err := json.Unmarshal(meta, &msg.Metadata); err != nil {
			return nil, fmt.Errorf("outboxtest: message %s: metadata: %w", id, err)
		}
		out = append(out, msg)
	}
	return out, rows.Err()
}

// RequirePublished fails t unless exactly one pending message to topic, as
// q sees it, satisfies match (nil matches any), and returns that message:
// call it with the transaction that called outbox.PublishTx, before it
// commits (or with a pool before any relay runs; a row a relay published,
// or one parked, is not pending).
func RequirePublished(t testing.TB, q Querier, topic string, match func(*message.Message) bool) *message.Message {
	t.Helper()
	msgs, err := Pending(t.Context(), q, topic)
	if err != nil {
		t.Fatalf("%v", err)
	}
	var found []*message.Message
	for _, m := range msgs {
		if match == nil || match(m) {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("outboxtest: %d pending messages to %s match, want 1 (of %d pending)", len(found), topic, len(msgs))
	}
	return found[0]
}

// RequireNothingPublished fails t if any message to topic is pending, as q
// sees it: for a path that must not publish. Pass the transaction of a
// refused request before it ends, or, after a rollback, a pool on a
// database of the test's own (pgtest.Server.TestDatabase), where no other
// test's rows are pending.
func RequireNothingPublished(t testing.TB, q Querier, topic string) {
	t.Helper()
	msgs, err := Pending(t.Context(), q, topic)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if len(msgs) != 0 {
		t.Fatalf("outboxtest: %d messages to %s pending, want none (first: %s)", len(msgs), topic, msgs[0].UUID)
	}
}
