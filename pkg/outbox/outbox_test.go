package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

func TestPublishTx(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		pool  *pgxpool.Pool
		topic string
	}

	setup := func(t *testing.T) (context.Context, *testBundle) {
		t.Helper()
		return t.Context(), &testBundle{pool: newPool(t), topic: newTopic(t)}
	}

	errRollback := errors.New("domain write failed")

	t.Run("RollbackWritesNothingAndPublishesNothing", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)
		sink := newSink(t, bundle.topic)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: newPublisher(t)})

		rolledBack := outbox.NewMessage("order-1", []byte("rolled back"))
		err := pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			require.NoError(t, outbox.PublishTx(ctx, tx, bundle.topic, rolledBack))
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		require.Zero(t, countRows(t, bundle.pool, "true"), "a rolled-back transaction left an outbox row")

		n, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the relay published a rolled-back message")

		// A later message with the same key goes to the same partition. If
		// the rolled-back one had reached Kafka it would sit before it, so
		// the committed one must be the first record of its partition.
		committed := outbox.NewMessage("order-1", []byte("committed"))
		publishCommitted(t, bundle.pool, bundle.topic, committed)
		n, err = relay.RelayOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		sink.WaitFor(t, []string{committed.UUID})
		records := sink.Records()
		require.Len(t, records, 1)
		require.Equal(t, committed.UUID, messageID(records[0]))
		require.Zero(t, records[0].Offset, "something was published to the partition before the committed message")
	})

	t.Run("CommitWritesOneRow", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)

		msg := outbox.NewMessage("customer-7", []byte(`{"total":42}`))
		msg.Metadata.Set("trace_id", "abc123")
		require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, bundle.topic, msg)
		}))

		rows, err := bundle.pool.Query(ctx, `
			SELECT message_id::text, topic, partition_key, payload, metadata, published_at IS NULL
			FROM outbox_messages`)
		require.NoError(t, err)
		type row struct {
			MessageID, Topic, Key string
			Payload               []byte
			Metadata              map[string]string
			Pending               bool
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		require.Len(t, got, 1)
		_, stamped := outbox.CreatedAt(&message.Message{Metadata: got[0].Metadata}) // tracing.go stamps the write time
		require.True(t, stamped, "metadata %v has no %s", got[0].Metadata, outbox.CreatedAtMetadata)
		delete(got[0].Metadata, outbox.CreatedAtMetadata)
		require.Regexp(t, `^[0-9a-f-]{36}:1$`, got[0].Metadata[outbox.SequenceMetadata], "the key's first message")
		delete(got[0].Metadata, outbox.SequenceMetadata)
		require.Equal(t, []row{{
			MessageID: msg.UUID,
			Topic:     bundle.topic,
			Key:       "customer-7",
			Payload:   []byte(`{"total":42}`),
			Metadata:  map[string]string{outbox.KeyMetadata: "customer-7", "trace_id": "abc123"},
			Pending:   true,
		}}, got)
	})

	t.Run("SeveralMessagesInOneCall", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)

		msgs := []*message.Message{
			outbox.NewMessage("a", []byte("1")),
			outbox.NewMessage("b", []byte("2")),
			outbox.NewMessage("a", []byte("3")),
		}
		require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, bundle.topic, msgs...)
		}))

		rows, err := bundle.pool.Query(ctx, `SELECT message_id::text FROM outbox_messages ORDER BY id`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, ids(msgs), got, "rows must be in argument order: the relay publishes in id order")
	})

	t.Run("MessageWithoutUUIDGetsUUIDv7", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)

		msg := message.NewMessage("", []byte("x"))
		require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, bundle.topic, msg)
		}))
		id, err := uuid.Parse(msg.UUID)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(7), id.Version())

		var key string
		require.NoError(t, bundle.pool.QueryRow(ctx,
			`SELECT partition_key FROM outbox_messages WHERE message_id = $1`, msg.UUID).Scan(&key))
		require.Empty(t, key)
	})

	// A message without a body (an event whose key says it all) is valid
	// Watermill; pgx would send its nil payload as NULL.
	t.Run("NilPayload", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)

		require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, bundle.topic, outbox.NewMessage("k", nil))
		}))
		require.Equal(t, 1, countRows(t, bundle.pool, "payload = ''"))
	})

	t.Run("RejectsBadInput", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)

		require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
			require.ErrorContains(t, outbox.PublishTx(ctx, tx, "", outbox.NewMessage("k", nil)), "empty topic")
			require.ErrorContains(t, outbox.PublishTx(ctx, tx, bundle.topic, message.NewMessage("not-a-uuid", nil)), "not-a-uuid")
			require.NoError(t, outbox.PublishTx(ctx, tx, bundle.topic)) // nothing to write
			return nil
		}))
		require.Zero(t, countRows(t, bundle.pool, "true"))
	})
}

func TestNewMessage(t *testing.T) {
	t.Parallel()

	msg := outbox.NewMessage("order-9", []byte("p"))
	id, err := uuid.Parse(msg.UUID)
	require.NoError(t, err)
	require.Equal(t, uuid.Version(7), id.Version())
	require.Equal(t, []byte("p"), []byte(msg.Payload))

	key, err := outbox.PartitionKey("any-topic", msg)
	require.NoError(t, err)
	require.Equal(t, "order-9", key)

	// The metadata is what the row keeps, so it must survive JSON.
	raw, err := json.Marshal(msg.Metadata)
	require.NoError(t, err)
	require.JSONEq(t, `{"partition_key":"order-9"}`, string(raw))
}
