package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// payload is what the relay tests put in a message: its key and its place
// in that key's sequence, so a consumer can check per-key order.
type payload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

func newKeyedMessage(key string, seq int) *message.Message {
	raw, _ := json.Marshal(payload{Key: key, Seq: seq}) // cannot fail: two plain fields
	return outbox.NewMessage(key, raw)
}

// relayBundle is what a relay test needs: a database of its own, the real
// watermill-kafka publisher, a topic of its own and what reached it.
type relayBundle struct {
	pool  *pgxpool.Pool
	pub   message.Publisher
	topic string
	sink  *sink // everything that reached topic
}

func setupRelay(t *testing.T) (context.Context, *relayBundle) {
	t.Helper()
	topic := newTopic(t)
	return t.Context(), &relayBundle{
		pool:  newPool(t),
		pub:   newPublisher(t),
		topic: topic,
		sink:  newSink(t, topic),
	}
}

// TestRelay: one relay publishes every committed row, in per-key order,
// wakes on commits, backs off from a failing publisher and shuts down cleanly.
func TestRelay(t *testing.T) {
	t.Parallel()

	t.Run("PublishesCommittedRows", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		other := newTopic(t)
		otherSink := newSink(t, other)

		// Ten transactions, each writing one message for each of six keys;
		// four keys go to one topic and two to another, interleaved, so a
		// batch holds alternating runs of both topics.
		const rounds = 10
		keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
		topicOf := map[string]string{"k0": bundle.topic, "k1": bundle.topic, "k4": other, "k2": bundle.topic, "k3": bundle.topic, "k5": other}
		sent := map[string]*message.Message{}
		for seq := range rounds {
			msg := map[string]*message.Message{}
			for _, k := range keys {
				msg[k] = newKeyedMessage(k, seq)
				msg[k].Metadata.Set("source", "relay-test")
				sent[msg[k].UUID] = msg[k]
			}
			require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
				return errors.Join(
					outbox.PublishTx(ctx, tx, bundle.topic, msg["k0"], msg["k1"]),
					outbox.PublishTx(ctx, tx, other, msg["k4"]),
					outbox.PublishTx(ctx, tx, bundle.topic, msg["k2"], msg["k3"]),
					outbox.PublishTx(ctx, tx, other, msg["k5"]),
				)
			}))
		}

		// A batch size that does not divide the row count: Run must keep
		// going while batches come back full, then finish the remainder.
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, BatchSize: 7})
		startRelay(t, relay)

		var want, wantOther []string
		for id, msg := range sent {
			if topicOf[msg.Metadata.Get(outbox.KeyMetadata)] == other {
				wantOther = append(wantOther, id)
			} else {
				want = append(want, id)
			}
		}
		bundle.sink.WaitFor(t, want)
		otherSink.WaitFor(t, wantOther)
		// Stats count a batch after its transaction commits.
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published >= int64(len(sent)) },
			"rows still unmarked after their messages reached Kafka")
		require.Equal(t, outbox.RelayStats{Published: int64(len(sent)), Batches: int64(len(sent)+6) / 7}, relay.Stats())
		require.Equal(t, len(sent), countRows(t, bundle.pool, "published_at >= created_at"))

		partitionOf := map[string]int32{}
		lastOffset := map[string]int64{}
		lastSeq := map[string]int{}
		records := append(bundle.sink.Records(), otherSink.Records()...)
		require.Len(t, records, len(sent), "nothing failed, so nothing may be published twice")
		for _, r := range records {
			msg, ok := sent[messageID(r)]
			require.True(t, ok, "unknown message id %q", messageID(r))
			key := msg.Metadata.Get(outbox.KeyMetadata)
			require.Equal(t, topicOf[key], r.Topic)
			require.Equal(t, key, string(r.Key), "partition key must become the Kafka record key")
			require.Equal(t, []byte(msg.Payload), r.Value)
			require.Equal(t, key, header(r, outbox.KeyMetadata))
			require.Equal(t, "relay-test", header(r, "source"))

			var p payload
			require.NoError(t, json.Unmarshal(r.Value, &p))
			if part, seen := partitionOf[key]; seen {
				require.Equal(t, part, r.Partition, "key %s spread over partitions", key)
				require.Greater(t, r.Offset, lastOffset[key])
				require.Equal(t, lastSeq[key]+1, p.Seq, "key %s out of order", key)
			} else {
				require.Zero(t, p.Seq, "key %s: first record is not the first message", key)
			}
			partitionOf[key], lastOffset[key], lastSeq[key] = r.Partition, r.Offset, p.Seq
		}
		for _, k := range keys {
			require.Equal(t, rounds-1, lastSeq[k], "key %s", k)
		}
	})

	// Three replicas share the database, each with its own Kafka producer,
	// while eight producers commit concurrently: nothing is lost, every row
	// ends marked, and no row is marked twice.

	t.Run("WakesOnCommit", func(t *testing.T) {
		t.Parallel()
		_, bundle := setupRelay(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: time.Hour})

		first := outbox.NewMessage("k", []byte("0"))
		publishCommitted(t, bundle.pool, bundle.topic, first)
		startRelay(t, relay)
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 }, "the first row was not published")

		// The relay is now idle with an hour to its next poll. Each commit
		// must wake it. (Besides notifications, only the one wake-up the
		// listener gives itself after LISTEN could publish a row here, so
		// with notifications broken at most one of these would go out.)
		for i := 2; i <= 4; i++ {
			msg := outbox.NewMessage("k", []byte{byte('0' + i)})
			start := time.Now()
			publishCommitted(t, bundle.pool, bundle.topic, msg)
			eventually(t, 5*time.Second, func() bool { return relay.Stats().Published == int64(i) },
				"commit %d did not wake the relay", i)
			bundle.sink.WaitFor(t, []string{msg.UUID})
			t.Logf("commit %d published after %v", i, time.Since(start))
		}
	})

	// A row whose producer did not notify (PublishTx skips the notification
	// while another producer holds it) is found by the poll, which first
	// asks whether any row waits at all.

	t.Run("PollFindsRowWithoutNotification", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: 50 * time.Millisecond})
		startRelay(t, relay)
		publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", []byte("notified")))
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })
		time.Sleep(100 * time.Millisecond) // past the follow-up polls: the relay waits for its regular poll

		var id string
		require.NoError(t, bundle.pool.QueryRow(ctx, `
			INSERT INTO outbox_messages (message_id, topic, payload) VALUES (gen_random_uuid(), $1, 'silent')
			RETURNING message_id::text`, bundle.topic).Scan(&id)) // no NOTIFY
		bundle.sink.WaitFor(t, []string{id})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 2 })
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	// An open transaction that wrote a row does not hold back rows committed
	// after it, and its own row goes out once it commits.

	t.Run("LongTransactionDoesNotStall", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub})
		startRelay(t, relay)

		txA, err := bundle.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = txA.Rollback(context.Background()) })
		msgA := outbox.NewMessage("a", []byte("A"))
		require.NoError(t, outbox.PublishTx(ctx, txA, bundle.topic, msgA))
		var idA int64
		require.NoError(t, txA.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE message_id = $1`, msgA.UUID).Scan(&idA))

		msgB := outbox.NewMessage("b", []byte("B"))
		publishCommitted(t, bundle.pool, bundle.topic, msgB)
		var idB int64
		require.NoError(t, bundle.pool.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE message_id = $1`, msgB.UUID).Scan(&idB))
		require.Less(t, idA, idB, "A's row must come first in id order for this test to mean anything")

		bundle.sink.WaitFor(t, []string{msgB.UUID})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })
		require.Equal(t, 1, countRows(t, bundle.pool, "published_at IS NOT NULL"))
		require.Zero(t, bundle.sink.Counts()[msgA.UUID], "an uncommitted row reached Kafka")

		require.NoError(t, txA.Commit(ctx))
		bundle.sink.WaitFor(t, []string{msgA.UUID})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 2 })
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	t.Run("FailingPublisher", func(t *testing.T) {
		t.Parallel()

		// The broker refuses: rows stay pending while it does, and all go
		// out once it recovers.
		t.Run("BeforeSend", func(t *testing.T) {
			t.Parallel()
			_, bundle := setupRelay(t)
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.down.Store(true)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: 10 * time.Millisecond})

			var msgs []*message.Message
			for i := range 10 {
				msgs = append(msgs, newKeyedMessage(fmt.Sprint("k", i%3), i))
			}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			startRelay(t, relay)

			// Wait for a few failed attempts, or for the first wrongly marked row.
			eventually(t, waitTimeout, func() bool {
				return relay.Stats().Errors >= 3 || countRows(t, bundle.pool, "published_at IS NOT NULL") > 0
			})
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NOT NULL"), "a row was marked though Publish failed")
			require.GreaterOrEqual(t, relay.Stats().Errors, int64(3))
			require.Zero(t, relay.Stats().Published)
			require.Empty(t, bundle.sink.Records())

			pub.down.Store(false)
			bundle.sink.WaitFor(t, ids(msgs))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == int64(len(msgs)) })
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
		})

		// The broker stores the batch but the acknowledgement is lost, twice:
		// the rows are republished, so the consumer sees duplicates of the
		// same message ids, never a gap.
		t.Run("AckLost", func(t *testing.T) {
			t.Parallel()
			_, bundle := setupRelay(t)
			const lostAcks = 2
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.loseAcks.Store(lostAcks)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: 10 * time.Millisecond})

			var msgs []*message.Message
			for i := range 10 {
				msgs = append(msgs, newKeyedMessage(fmt.Sprint("k", i%3), i))
			}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			startRelay(t, relay)

			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == int64(len(msgs)) })
			require.Equal(t, outbox.RelayStats{Published: int64(len(msgs)), Batches: 1, Errors: lostAcks}, relay.Stats())
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
			eventually(t, waitTimeout, func() bool { return len(bundle.sink.Records()) == (lostAcks+1)*len(msgs) })
			counts := bundle.sink.Counts()
			for _, msg := range msgs {
				require.Equal(t, lostAcks+1, counts[msg.UUID], "message %s", msg.UUID)
			}
		})
	})

	t.Run("Shutdown", func(t *testing.T) {
		t.Parallel()

		t.Run("Idle", func(t *testing.T) {
			t.Parallel()
			_, bundle := setupRelay(t)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: time.Hour})
			run := startRelay(t, relay)
			publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", nil))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })

			took := run.Stop(t)
			require.Less(t, took, 3*time.Second)
			t.Logf("Run returned %v after cancel", took)
		})

		t.Run("DuringErrorBackoff", func(t *testing.T) {
			t.Parallel()
			_, bundle := setupRelay(t)
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.down.Store(true)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: time.Hour})
			publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", nil))
			run := startRelay(t, relay)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Errors == 1 })

			require.Less(t, run.Stop(t), 3*time.Second)
		})

		// A batch in flight when the context ends is finished and marked,
		// not abandoned to be published again.
		t.Run("FinishesBatchInFlight", func(t *testing.T) {
			t.Parallel()
			_, bundle := setupRelay(t)
			pub := newGatedPublisher(bundle.pub)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, PollInterval: time.Hour})
			msgs := []*message.Message{outbox.NewMessage("a", nil), outbox.NewMessage("b", nil), outbox.NewMessage("c", nil)}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)

			run := startRelay(t, relay)
			t.Cleanup(pub.Release)
			pub.WaitEntered(t)
			// End Run's context while Publish is blocked, then let it finish.
			run.Cancel()
			pub.Release()
			run.Wait(t)

			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"), "the batch in flight was abandoned")
			require.Equal(t, int64(len(msgs)), relay.Stats().Published)
			bundle.sink.WaitFor(t, ids(msgs))
		})
	})
}

var errBrokerDown = errors.New("injected: broker unavailable")

// faultyPublisher puts fault injection in front of the real Kafka publisher
// (in the spirit of pgx's faultyconn): the broker stays real.
type faultyPublisher struct {
	message.Publisher
	down     atomic.Bool  // every call fails without sending while set
	loseAcks atomic.Int64 // this many calls send, then report failure
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.down.Load() {
		return errBrokerDown
	}
	if p.loseAcks.Load() > 0 {
		p.loseAcks.Add(-1)
		if err := p.Publisher.Publish(topic, msgs...); err != nil {
			return err
		}
		return errors.New("injected: acknowledgement lost")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// gatedPublisher blocks the first Publish call until Release.
type gatedPublisher struct {
	message.Publisher
	entered chan struct{} // closed when the first call arrives
	release chan struct{} // closed to let it proceed
	once    sync.Once
	calls   atomic.Int64
}

// newGatedPublisher wraps pub. Register t.Cleanup(gate.Release) after
// startRelay, so that a failing test opens the gate before it stops the relay
// (cleanups run last-in first-out).
func newGatedPublisher(pub message.Publisher) *gatedPublisher {
	return &gatedPublisher{Publisher: pub, entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *gatedPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.calls.Add(1) == 1 {
		close(p.entered)
		<-p.release
	}
	return p.Publisher.Publish(topic, msgs...)
}

// WaitEntered waits until the first Publish call is blocked in the gate.
func (p *gatedPublisher) WaitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-p.entered:
	case <-time.After(waitTimeout):
		t.Fatal("the relay never started publishing")
	}
}

// Release lets the blocked call (and all later ones) through.
func (p *gatedPublisher) Release() { p.once.Do(func() { close(p.release) }) }

// TestRelayRunOnce: as inbox.Inbox and effect.Runner, a Relay runs once at
// a time: a second Run while the first runs is refused with ErrRunning, and
// Running says whether one runs.
func TestRelayRunOnce(t *testing.T) {
	t.Parallel()
	_, bundle := setupRelay(t)
	relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub})
	require.False(t, relay.Running())
	r := startRelay(t, relay)
	require.Eventually(t, relay.Running, 5*time.Second, 5*time.Millisecond)
	require.ErrorIs(t, relay.Run(t.Context()), outbox.ErrRunning, "a second Run must be refused while the first runs")
	require.True(t, relay.Running(), "the refused call leaves the first running")
	r.Stop(t)
	require.False(t, relay.Running())
}
