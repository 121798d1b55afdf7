package inbox_test

import (
	"bytes"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// quarantineID returns the id of the quarantine row of kind for message id.
func quarantineID(t *testing.T, b *testBundle, kind, id string) int64 {
	t.Helper()
	return scalar[int64](t, b, `SELECT id FROM inbox_quarantine WHERE consumer = $1 AND kind = $2 AND message_id = $3`, consumer, kind, id)
}

// TestRedriveThroughKafka dead-letters a poison message in a real router
// behind a real broker, fixes the handler, redrives the dead letter, and
// checks that it is applied exactly once: a relay republishing the redriven
// row is suppressed, and a second redrive does nothing.
func TestRedriveThroughKafka(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
	var fixed atomic.Bool
	b.handler.hook = func(msg *message.Message, _ int) error {
		if bytes.Equal(msg.Payload, []byte("needs v2")) && !fixed.Load() {
			return errors.New("unknown field in payload")
		}
		return nil
	}

	suffix := watermill.NewShortUUID()
	topic := "redrive-test-" + suffix
	require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic))
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	logger := watermill.NopLogger{}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: "redrive-" + suffix,
	}, logger)
	require.NoError(t, err)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(),
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("apply", topic, sub, func(msg *message.Message) error {
		_, err := b.handler.handle(msg)
		return err
	}).AddMiddleware(in.Middleware)
	// The consumer's own relay: it publishes the redriven message (and the
	// dead letter, to <consumer>.dlq).
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Publisher: pub, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)

	runRouterAndRelay(t, b.ctx, router, relay)

	poison := outbox.NewMessage("order-1", []byte("needs v2"))
	poison.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	require.NoError(t, pub.Publish(topic, poison))
	status := func() string {
		return scalar[string](t, b, `SELECT coalesce((SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2), '')`, consumer, poison.UUID)
	}
	eventually(t, func() bool { return status() == "dead_lettered" }, 20*time.Second, "the poison message to be dead-lettered", b.events.count)
	require.Equal(t, 2, b.handler.callsFor(poison.UUID))

	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Kind: inbox.KindDeadLetter})
	require.NoError(t, err)
	require.Len(t, open, 1)
	dl := open[0]
	require.Equal(t, poison.UUID, dl.MessageID)
	require.Equal(t, topic, dl.Topic)
	require.Contains(t, dl.Reason, "unknown field in payload")

	// The fix ships; the operator redrives.
	fixed.Store(true)
	res, err := inboxadmin.New(b.pool).Retry(b.ctx, dl.ID, "alice")
	require.NoError(t, err)
	require.True(t, res.Redriven, res.Note)

	eventually(t, func() bool { return status() == "processed" }, 20*time.Second, "the redriven message to be applied", b.events.count)
	require.Equal(t, 1, appliedRows(t, b, consumer, poison.UUID))
	require.Equal(t, 3, b.handler.callsFor(poison.UUID), "two failed runs, then the redriven one")

	// It went out under its original id, key and metadata, through the outbox.
	var key, traceparent, redriveOf string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT partition_key, metadata->>'traceparent', metadata->>$3 FROM outbox_messages
		WHERE topic = $1 AND message_id = $2`, topic, poison.UUID, inbox.RedriveOfMetadata).Scan(&key, &traceparent, &redriveOf))
	require.Equal(t, "order-1", key)
	require.Equal(t, poison.Metadata.Get("traceparent"), traceparent, "the redrive continues the original trace")
	require.Equal(t, strconv.FormatInt(dl.ID, 10), redriveOf)

	// The relay dies after publishing, before marking: the redriven message
	// goes out again, and the inbox suppresses it.
	_, err = b.pool.Exec(b.ctx, `UPDATE outbox_messages SET published_at = NULL WHERE topic = $1 AND message_id = $2`, topic, poison.UUID)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `SELECT pg_notify($1, '')`, outbox.NotifyChannel("public"))
	require.NoError(t, err)
	eventually(t, func() bool {
		return scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE consumer = $1 AND message_id = $2`, consumer, poison.UUID) == 1
	}, 20*time.Second, "the republished redrive to be suppressed", b.events.count)
	require.Equal(t, 1, appliedRows(t, b, consumer, poison.UUID))

	// Redriving again is a no-op, and says so.
	again, err := inboxadmin.New(b.pool).Retry(b.ctx, dl.ID, "bob")
	require.NoError(t, err)
	require.False(t, again.Redriven)
	require.Contains(t, again.Note, "already redriven by alice")
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, topic), "one redrive row")

	resolved, err := inboxadmin.New(b.pool).GetQuarantined(b.ctx, dl.ID)
	require.NoError(t, err)
	require.Equal(t, inboxadmin.ResolutionRedriven, resolved.Resolution)
	require.Equal(t, "alice", resolved.ResolvedBy)
	require.NotNil(t, resolved.ResolvedAt)
	open, err = inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{})
	require.NoError(t, err)
	require.Empty(t, open, "nothing left to do")
}

func TestAdmin(t *testing.T) {
	t.Parallel()

	t.Run("RedriveOfAMessageAppliedMeanwhileDoesNothing", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		fail := true
		b.handler.hook = func(*message.Message, int) error {
			if fail {
				return inbox.Permanent(errors.New("bad input"))
			}
			return nil
		}
		mw := in.Middleware(b.handler.handle)
		id, payload := newID(), []byte(`{"v":2}`)
		require.NoError(t, deliver(b.ctx, mw, id, payload))
		qid := quarantineID(t, b, inbox.KindDeadLetter, id)

		// Retention swept the dead-lettered inbox row, then a replay of the
		// topic reached the fixed handler: the message is applied.
		_, err := b.pool.Exec(b.ctx, `DELETE FROM inbox_messages WHERE message_id = $1`, id)
		require.NoError(t, err)
		fail = false
		require.NoError(t, deliver(b.ctx, mw, id, payload))
		outboxRows := scalar[int](t, b, `SELECT count(*) FROM outbox_messages`)

		res, err := inboxadmin.New(b.pool).Retry(b.ctx, qid, "alice")
		require.NoError(t, err)
		require.False(t, res.Redriven)
		require.Contains(t, res.Note, "was applied")
		require.Equal(t, outboxRows, scalar[int](t, b, `SELECT count(*) FROM outbox_messages`), "nothing written")
		require.Equal(t, "processed", scalar[string](t, b, `SELECT status FROM inbox_messages WHERE message_id = $1`, id))
		q, err := inboxadmin.New(b.pool).GetQuarantined(b.ctx, qid)
		require.NoError(t, err)
		require.Nil(t, q.ResolvedAt, "still open, for the operator to discard")
	})

	t.Run("DiscardKeepsAnAuditRecord", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		id := newID()
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"amount":100}`)))
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"amount":999}`)))
		qid := quarantineID(t, b, inbox.KindPayloadConflict, id)

		_, err := inboxadmin.New(b.pool).Retry(b.ctx, qid, "alice")
		require.ErrorIs(t, err, inboxadmin.ErrNotRedrivable, "a conflict would only conflict again")
		_, err = inboxadmin.New(b.pool).Drop(b.ctx, qid, "alice", "")
		require.Error(t, err, "a discard needs a reason")

		before := time.Now()
		q, err := inboxadmin.New(b.pool).Drop(b.ctx, qid, "alice", "producer bug #42, amount corrected by hand")
		require.NoError(t, err)
		require.Equal(t, inboxadmin.ResolutionDiscarded, q.Resolution)
		require.Equal(t, "alice", q.ResolvedBy)
		require.Equal(t, "producer bug #42, amount corrected by hand", q.ResolutionNote)
		require.WithinDuration(t, before, *q.ResolvedAt, 5*time.Second)

		_, err = inboxadmin.New(b.pool).Drop(b.ctx, qid, "bob", "again")
		require.ErrorIs(t, err, inboxadmin.ErrResolved)
		_, err = inboxadmin.New(b.pool).Retry(b.ctx, 1<<40, "alice")
		require.ErrorIs(t, err, inboxadmin.ErrNotFound)

		open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
		require.NoError(t, err)
		require.Empty(t, open)
		all, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer, Resolved: true})
		require.NoError(t, err)
		require.Len(t, all, 1)
		require.Equal(t, "alice", all[0].ResolvedBy, "the first discard's record stands")
	})
}
