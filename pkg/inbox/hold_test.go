package inbox_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// holdBundle is a consumer behind a real router and broker, with its own
// relay (inboxadmin.Admin.Retry and inboxadmin.Admin.Drop write back through the outbox), whose handler
// refuses every payload that starts with "poison" until the message is fixed.
type holdBundle struct {
	*testBundle
	in    *inbox.Inbox
	topic string
	pub   message.Publisher

	mu    sync.Mutex
	fixed map[string]bool
	seen  []string // the ids the handler applied, in the order it ran them
}

// setupHold returns a holdBundle whose inbox has policy; batch puts the
// handler behind Inbox.Handler with BatchSize 8 instead of Middleware.
func setupHold(t *testing.T, policy inbox.DeadLetterPolicy, batch bool) *holdBundle {
	return setupHoldOn(t, policy, batch, nil)
}

// setupHoldOn is setupHold on an inbox partitioned by p, when p is set.
func setupHoldOn(t *testing.T, policy inbox.DeadLetterPolicy, batch bool, p *inbox.Partitioning) *holdBundle {
	t.Helper()
	cfg := inbox.Config{OnDeadLetter: policy, MaxAttempts: 2, RetryBackoff: time.Millisecond, Partitions: p}
	if batch {
		cfg.BatchSize = 8
	}
	in, b := setup(t, cfg)
	if p != nil {
		require.NoError(t, inbox.PartitionByIDTime(b.ctx, b.pool, *p, time.Now().Add(-p.Interval)))
	}
	h := &holdBundle{testBundle: b, in: in, topic: "hold-" + watermill.NewShortUUID(), fixed: map[string]bool{}}
	b.handler.hook = func(msg *message.Message, _ int) error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if strings.HasPrefix(string(msg.Payload), "poison") && !h.fixed[msg.UUID] {
			return inbox.Permanent(errors.New("cannot apply " + string(msg.Payload)))
		}
		h.seen = append(h.seen, msg.UUID)
		return nil
	}
	require.NoError(t, kfk.CreateTopics(b.ctx, 3, h.topic))

	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	logger := watermill.NopLogger{}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: h.topic,
	}, logger)
	require.NoError(t, err)
	h.pub, err = kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: kfk.Brokers(), Marshaler: marshaler, OverwriteSaramaConfig: kafkatest.Sarama(),
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.pub.Close() })
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	if batch {
		router.AddConsumerHandler("apply", h.topic, sub, in.Handler(func(ctx context.Context, _ pgx.Tx, msgs []*message.Message) error {
			for _, msg := range msgs {
				orig := msg.Context()
				msg.SetContext(ctx) // the batch's context holds the transaction
				_, err := b.handler.handle(msg)
				msg.SetContext(orig)
				if err != nil {
					return err
				}
			}
			return nil
		}))
	} else {
		router.AddConsumerHandler("apply", h.topic, sub, func(msg *message.Message) error {
			_, err := b.handler.handle(msg)
			return err
		}).AddMiddleware(in.Middleware)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Publisher: h.pub, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)

	runRouterAndRelay(t, b.ctx, router, relay)
	return h
}

// publish sends payload under key and returns its id.
func (h *holdBundle) publish(t *testing.T, key, payload string) string {
	t.Helper()
	msg := outbox.NewMessage(key, []byte(payload))
	require.NoError(t, h.pub.Publish(h.topic, msg))
	return msg.UUID
}

func (h *holdBundle) fix(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fixed[id] = true
}

// order returns the ids of ids in the order the handler applied them.
func (h *holdBundle) order(ids ...string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, id := range h.seen {
		for _, want := range ids {
			if id == want {
				out = append(out, id)
			}
		}
	}
	return out
}

// status is the inbox row's status of id, "" when there is none.
func (h *holdBundle) status(t *testing.T, id string) string {
	return scalar[string](t, h.testBundle, `SELECT coalesce((SELECT status FROM inbox_messages WHERE consumer = $1 AND message_id = $2), '')`, consumer, id)
}

// await waits until every id has status.
func (h *holdBundle) await(t *testing.T, status string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		eventually(t, func() bool { return h.status(t, id) == status }, 20*time.Second, id+" to be "+status, h.events.count)
	}
}

// TestHoldKey: key K's first message poisons; with HoldKey its next two park
// while key L flows, and after the redrive K's three apply in order, once
// each; the control, SkipKey, applies K's second and third before the first.
func TestHoldKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy inbox.DeadLetterPolicy
		batch  bool
	}{
		{"Middleware", inbox.HoldKey, false},
		{"BatchFunc", inbox.HoldKey, true},
		{"ControlSkipKey", inbox.SkipKey, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setupHold(t, tc.policy, tc.batch)
			k1 := h.publish(t, "K", "poison 1")
			h.await(t, "dead_lettered", k1)
			k2, l1 := h.publish(t, "K", "2"), h.publish(t, "L", "1")
			k3, l2 := h.publish(t, "K", "3"), h.publish(t, "L", "2")
			h.await(t, "processed", l1, l2) // other keys flow
			if tc.policy == inbox.HoldKey {
				h.await(t, "parked", k2, k3)
			}
			held, err := inboxadmin.New(h.pool).ListHeld(h.ctx, consumer)
			require.NoError(t, err)
			if tc.policy == inbox.HoldKey {
				require.Len(t, held, 1)
				require.Equal(t, "K", held[0].Key)
				require.Equal(t, k1, held[0].Holder)
				require.Equal(t, "held", held[0].State)
				require.Equal(t, 2, held[0].Parked)
				require.Equal(t, quarantineID(t, h.testBundle, inbox.KindDeadLetter, k1), held[0].DeadLetter)
				counts, err := inboxadmin.New(h.pool).HoldStats(h.ctx, consumer)
				require.NoError(t, err)
				require.Equal(t, inboxadmin.HoldCounts{Keys: 1, Parked: 2}, counts)
			} else {
				require.Empty(t, held)
			}

			h.fix(k1)
			res, err := inboxadmin.New(h.pool).Retry(h.ctx, quarantineID(t, h.testBundle, inbox.KindDeadLetter, k1), "alice")
			require.NoError(t, err)
			require.True(t, res.Redriven, res.Note)
			h.await(t, "processed", k1, k2, k3)

			want := []string{k1, k2, k3}
			if tc.policy == inbox.SkipKey {
				want = []string{k2, k3, k1} // the control: out of order
			}
			require.Equal(t, want, h.order(k1, k2, k3), "the order K's messages were applied in (k1 %s, k2 %s, k3 %s)", k1, k2, k3)
			for _, id := range []string{k1, k2, k3, l1, l2} {
				require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, id), "applied once: %s", id)
			}
			if !tc.batch { // in a batch, its companions' calls refused it too
				require.Equal(t, 2, h.handler.callsFor(k1), "refused once, then applied")
			}
			require.Equal(t, 1, h.handler.callsFor(k2))
			require.Equal(t, 1, h.handler.callsFor(k3))
			eventually(t, func() bool {
				held, err := inboxadmin.New(h.pool).ListHeld(h.ctx, consumer)
				require.NoError(t, err)
				return len(held) == 0
			}, 10*time.Second, "the hold to be gone", h.events.count)
			require.Equal(t, 0, scalar[int](t, h.testBundle, `SELECT count(*) FROM inbox_parked`))
		})
	}
}

// TestHoldKeyRelease: a discard releases the key in order too; a parked
// message that fails when released holds the key again, with the rest still
// parked behind it; and a key released is held again by its next poison.
func TestHoldKeyRelease(t *testing.T) {
	t.Parallel()

	for _, p := range []*inbox.Partitioning{nil, {Interval: time.Hour}} {
		name := "DiscardReleasesInOrder"
		if p != nil {
			name += "Partitioned" // the release finds the parked rows in their partitions
		}
		t.Run(name, func(t *testing.T) { discardReleasesInOrder(t, p) })
	}

	t.Run("ReleasedMessageFailsHoldsAgain", releasedMessageFailsHoldsAgain)
}

func discardReleasesInOrder(t *testing.T, p *inbox.Partitioning) {
	t.Parallel()
	{
		h := setupHoldOn(t, inbox.HoldKey, false, p)
		k1 := h.publish(t, "K", "poison 1")
		h.await(t, "dead_lettered", k1)
		k2, k3 := h.publish(t, "K", "2"), h.publish(t, "K", "3")
		h.await(t, "parked", k2, k3)

		qid := quarantineID(t, h.testBundle, inbox.KindDeadLetter, k1)
		_, err := inboxadmin.New(h.pool).Drop(h.ctx, qid, "alice", "superseded by a manual correction")
		require.NoError(t, err)
		h.await(t, "processed", k2, k3)

		require.Equal(t, []string{k2, k3}, h.order(k1, k2, k3))
		require.Equal(t, 0, appliedRows(t, h.testBundle, consumer, k1), "a discarded message is never applied")
		require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, k2))
		require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, k3))
		// k2 went back through the outbox in k1's place, and says why.
		require.Equal(t, "1", scalar[string](t, h.testBundle, `SELECT count(*)::text FROM outbox_messages
			WHERE topic = $1 AND message_id = $2 AND metadata->>$3 = $4`, h.topic, k2, inbox.ReleaseOfMetadata, strconv.FormatInt(qid, 10)))
		eventually(t, func() bool { return scalar[int](t, h.testBundle, `SELECT count(*) FROM inbox_held_keys`) == 0 }, 10*time.Second, "the hold to be gone", h.events.count)
		if p != nil {
			require.Zero(t, scalar[int](t, h.testBundle, `SELECT count(*) FROM inbox_messages WHERE tableoid::regclass::text NOT LIKE 'inbox_messages_p%'`),
				"every row in an hour's partition")
		}
	}
}

func releasedMessageFailsHoldsAgain(t *testing.T) {
	t.Parallel()
	{
		h := setupHold(t, inbox.HoldKey, false)
		k1 := h.publish(t, "K", "poison 1")
		h.await(t, "dead_lettered", k1)
		k2, k3 := h.publish(t, "K", "poison 2"), h.publish(t, "K", "3")
		h.await(t, "parked", k2, k3)

		h.fix(k1)
		_, err := inboxadmin.New(h.pool).Retry(h.ctx, quarantineID(t, h.testBundle, inbox.KindDeadLetter, k1), "alice")
		require.NoError(t, err)
		h.await(t, "processed", k1)
		h.await(t, "dead_lettered", k2) // released, it failed: the key is held again
		held, err := inboxadmin.New(h.pool).ListHeld(h.ctx, consumer)
		require.NoError(t, err)
		require.Len(t, held, 1)
		require.Equal(t, k2, held[0].Holder)
		require.Equal(t, "held", held[0].State)
		require.Equal(t, 1, held[0].Parked, "k3 still waits")
		require.Equal(t, "parked", h.status(t, k3))
		k4 := h.publish(t, "K", "4")
		h.await(t, "parked", k4)

		h.fix(k2)
		_, err = inboxadmin.New(h.pool).Retry(h.ctx, quarantineID(t, h.testBundle, inbox.KindDeadLetter, k2), "alice")
		require.NoError(t, err)
		h.await(t, "processed", k2, k3, k4)
		require.Equal(t, []string{k1, k2, k3, k4}, h.order(k1, k2, k3, k4))
		for _, id := range []string{k1, k2, k3, k4} {
			require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, id), id)
		}
		eventually(t, func() bool { return scalar[int](t, h.testBundle, `SELECT count(*) FROM inbox_held_keys`) == 0 }, 10*time.Second, "the hold to be gone", h.events.count)

		// Released, the key is held again by its next poison.
		k5 := h.publish(t, "K", "poison 5")
		h.await(t, "dead_lettered", k5)
		held, err = inboxadmin.New(h.pool).ListHeld(h.ctx, consumer)
		require.NoError(t, err)
		require.Len(t, held, 1)
		require.Equal(t, k5, held[0].Holder)
	}
}

// TestHoldKeyParking: a parked message's redelivery is suppressed like any
// duplicate (not parked twice, not applied), and one with another payload is
// a conflict; messages of other keys, or of none, are applied; a release
// that died half-way is finished by the next delivery of the key.
func TestHoldKeyParking(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{OnDeadLetter: inbox.HoldKey})
	b.handler.hook = func(msg *message.Message, _ int) error {
		if strings.HasPrefix(string(msg.Payload), "poison") {
			return inbox.Permanent(errors.New("cannot apply " + string(msg.Payload)))
		}
		return nil
	}
	mw := in.Middleware(b.handler.handle)
	send := func(id, key, payload string) {
		t.Helper()
		msg := message.NewMessage(id, []byte(payload))
		msg.Metadata.Set(outbox.KeyMetadata, key)
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
	}
	k1, k2, l1, none := newID(), newID(), newID(), newID()

	send(k1, "K", "poison 1")
	send(k2, "K", "2")
	send(l1, "L", "1")
	send(none, "", "keyless")
	require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(k1))
	require.Equal(t, []inbox.Outcome{inbox.Parked}, b.events.outcomes(k2))
	require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(l1))
	require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(none))

	send(k2, "K", "2") // redelivered
	require.Equal(t, []inbox.Outcome{inbox.Parked, inbox.Duplicate}, b.events.outcomes(k2))
	send(k2, "K", "2, forged")
	require.Equal(t, inbox.Conflict, b.events.last(t).Outcome)
	require.Contains(t, b.events.last(t).Reason, "already parked")

	require.Equal(t, 0, b.handler.callsFor(k2), "a parked message is not applied")
	require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_parked WHERE message_id = $1`, k2), "parked once")
	require.Equal(t, 1, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, k2))
	require.Equal(t, int64(1), in.Stats().Parked)

	// A release that died half-way (the holder applied, its delivery not
	// acknowledged): the holder comes back, a duplicate, and finishes it.
	k3 := newID()
	send(k3, "K", "3")
	_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET status = 'processed' WHERE message_id = $1`, k1)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `UPDATE inbox_held_keys SET state = 'released'`)
	require.NoError(t, err)
	send(k1, "K", "poison 1")
	require.Equal(t, inbox.Duplicate, b.events.outcomes(k1)[1])
	var applied []string
	for _, e := range b.events.all() {
		if e.Outcome == inbox.Applied && (e.MessageID == k2 || e.MessageID == k3) {
			applied = append(applied, e.MessageID)
		}
	}
	require.Equal(t, []string{k2, k3}, applied, "the parked messages, in order")
	require.Equal(t, 1, appliedRows(t, b, consumer, k2))
	require.Equal(t, 1, appliedRows(t, b, consumer, k3))
	require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_held_keys`))
	require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_parked`))
	k4 := newID()
	send(k4, "K", "4")
	require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(k4), "the key flows again")
}

// TestBulkReleasesHeldKeys: a bulk action on the dead letters that hold
// their keys (Selection.Holding) chooses them and no other: a dead letter
// of an empty key holds nothing and is left; dropping them releases each
// key, whose parked messages are then applied in order, each once.
func TestBulkReleasesHeldKeys(t *testing.T) {
	t.Parallel()
	h := setupHold(t, inbox.HoldKey, false)
	a1, b1 := h.publish(t, "A", "poison a"), h.publish(t, "B", "poison b")
	loose := h.publish(t, "", "poison, no key")
	h.await(t, "dead_lettered", a1, b1, loose)
	a2, b2 := h.publish(t, "A", "a2"), h.publish(t, "B", "b2")
	h.await(t, "parked", a2, b2)

	plan, err := inboxadmin.New(h.pool).DryRun(h.ctx, inboxadmin.Selection{Consumer: consumer, Holding: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), plan.Count, "the two holders, not the dead letter of no key")
	started, err := inboxadmin.New(h.pool).StartBulk(h.ctx, inboxadmin.ActionDrop, plan, "alice", "superseded")
	require.NoError(t, err)
	done, err := inboxadmin.New(h.pool).RunBulk(h.ctx, started.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(2), done.Done)
	h.await(t, "processed", a2, b2)
	require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, a2))
	require.Equal(t, 1, appliedRows(t, h.testBundle, consumer, b2))
	open, err := inboxadmin.New(h.pool).ListQuarantined(h.ctx, inboxadmin.QuarantineFilter{})
	require.NoError(t, err)
	require.Len(t, open, 1)
	require.Equal(t, loose, open[0].MessageID, "the dead letter that held nothing is left")
}
