package inboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
)

// watchdogBundle is a broker with a two-partition topic holding records on
// both partitions, and a watchdog for a consumer group on it.
type watchdogBundle struct {
	brokers  []string
	topic    string
	readings chan []inboxkafka.PartitionLag
}

func setupWatchdog(t *testing.T) *watchdogBundle {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "events"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	b := &watchdogBundle{brokers: cluster.ListenAddrs(), topic: "events", readings: make(chan []inboxkafka.PartitionLag, 100)}
	conf := saramaConf("producer")
	conf.Producer.Partitioner = sarama.NewManualPartitioner
	conf.Producer.Return.Successes = true
	producer, err := sarama.NewSyncProducer(b.brokers, conf)
	require.NoError(t, err)
	defer producer.Close()
	for p := int32(0); p < 2; p++ {
		for i := range 5 {
			_, _, err := producer.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Partition: p, Value: sarama.StringEncoder(fmt.Sprint(i))})
			require.NoError(t, err)
		}
	}
	return b
}

func saramaConf(clientID string) *sarama.Config {
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	conf.ClientID = clientID
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest
	conf.Consumer.Offsets.AutoCommit.Interval = 50 * time.Millisecond
	conf.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	return conf
}

// watchdog runs a watchdog for clientID's member of group "g" (a second
// timeout, readings every 100ms, each sent to b.readings) and returns what
// Run returned, once it returns.
func (b *watchdogBundle) watchdog(t *testing.T, clientID string) (*inboxkafka.Watchdog, <-chan error) {
	t.Helper()
	wd, err := inboxkafka.NewWatchdog(inboxkafka.WatchdogConfig{
		Brokers: b.brokers, Sarama: saramaConf("watchdog"), Group: "g", Topic: b.topic, ClientID: clientID,
		Timeout: time.Second, Interval: 100 * time.Millisecond,
		OnRead: func(l []inboxkafka.PartitionLag) {
			select {
			case b.readings <- l:
			default:
			}
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { defer close(finished); done <- wd.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-finished })
	return wd, done
}

// consume runs a watermill-kafka subscriber as member clientID of group "g"
// behind a router whose handler is wrapped by wd's Middleware.
func (b *watchdogBundle) consume(t *testing.T, clientID string, wd *inboxkafka.Watchdog, handle func(partition int32) error) {
	t.Helper()
	logger := watermill.NopLogger{}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: b.brokers, Unmarshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: saramaConf(clientID), ConsumerGroup: "g", NackResendSleep: 10 * time.Millisecond}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("h", b.topic, sub, func(msg *message.Message) error {
		p, _ := kafka.MessagePartitionFromCtx(msg.Context())
		return handle(p)
	})
	router.AddMiddleware(wd.Middleware)
	go router.Run(context.Background()) //nolint:errcheck // closed below
	t.Cleanup(func() { router.Close() })
}

// TestWatchdog: a partition the consumer holds with records waiting, its
// committed offset still and nothing of it reaching the handler, is a stall
// Run returns, whether the claim never delivers (Sarama waiting for a
// leader) or a delivery never returns; a partition whose message the
// handler retries, an idle one, and one held by a member the watchdog
// cannot tell apart from another, are left alone.
func TestWatchdog(t *testing.T) {
	t.Parallel()

	t.Run("AClaimThatNeverDelivers", func(t *testing.T) {
		t.Parallel()
		b := setupWatchdog(t)
		_, stalled := b.watchdog(t, "stuck-1")
		// A bare Sarama member that consumes partition 0 and sits on its
		// claim of partition 1 without reading it.
		group, err := sarama.NewConsumerGroup(b.brokers, "g", saramaConf("stuck-1"))
		require.NoError(t, err)
		t.Cleanup(func() { group.Close() })
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go group.Consume(ctx, []string{b.topic}, sittingHandler{sit: 1}) //nolint:errcheck // the test reads the watchdog
		select {
		case err := <-stalled:
			require.ErrorIs(t, err, inboxkafka.ErrStalled)
			require.ErrorContains(t, err, "events/1: 5 records past the committed offset")
			require.ErrorContains(t, err, "no delivery reached the handler")
			require.NotContains(t, err.Error(), "events/0", "partition 0 was consumed")
		case <-time.After(30 * time.Second):
			t.Fatal("the watchdog never saw partition 1 stall")
		}
	})

	t.Run("ADeliveryThatNeverEnds", func(t *testing.T) {
		t.Parallel()
		b := setupWatchdog(t)
		wd, stalled := b.watchdog(t, "stuck-2")
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		b.consume(t, "stuck-2", wd, func(p int32) error {
			if p == 1 {
				<-release
			}
			return nil
		})
		select {
		case err := <-stalled:
			require.ErrorIs(t, err, inboxkafka.ErrStalled)
			require.ErrorContains(t, err, "events/1")
			require.ErrorContains(t, err, "a delivery has been in the handler all along")
		case <-time.After(30 * time.Second):
			t.Fatal("the watchdog never saw partition 1 stall")
		}
	})

	// Retried: readings with partition 1 held and
	// lagging for over twice the timeout, and no stall.
	for _, tc := range []struct {
		name   string
		member string // the watchdog's ClientID; the consumer is "busy"
		handle func(p int32) error
	}{
		{name: "ARetriedMessage", member: "busy", handle: func(p int32) error {
			if p == 1 {
				return errors.New("the database is away") // nacked, delivered again
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupWatchdog(t)
			wd, stalled := b.watchdog(t, tc.member)
			var seenLagging atomic.Int64
			b.consume(t, "busy", wd, tc.handle)
			deadline := time.After(30 * time.Second)
			var first time.Time
			for seenLagging.Load() == 0 || time.Since(first) < 2500*time.Millisecond {
				select {
				case err := <-stalled:
					t.Fatalf("the watchdog took it for a stall: %v", err)
				case <-deadline:
					t.Fatal("partition 1 was never seen held and lagging")
				case lags := <-b.readings:
					for _, l := range lags {
						if l.Partition == 1 && l.Owner == "busy" && l.Lag() > 0 {
							if seenLagging.Add(1) == 1 {
								first = time.Now()
							}
						}
					}
				}
			}
		})
	}

	// Two members share a client.id, and the one holding partition 1 sits
	// on it: a stall, but the watchdog cannot tell whether it is its own.
	t.Run("AMemberItCannotTellApart", func(t *testing.T) {
		t.Parallel()
		b := setupWatchdog(t)
		_, stalled := b.watchdog(t, "twin")
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		for range 2 {
			group, err := sarama.NewConsumerGroup(b.brokers, "g", saramaConf("twin"))
			require.NoError(t, err)
			t.Cleanup(func() { group.Close() })
			go func() {
				for ctx.Err() == nil {
					group.Consume(ctx, []string{b.topic}, sittingHandler{sit: 1}) //nolint:errcheck // the test reads the watchdog
				}
			}()
		}
		deadline := time.After(30 * time.Second)
		var first time.Time
		for first.IsZero() || time.Since(first) < 2500*time.Millisecond {
			select {
			case err := <-stalled:
				t.Fatalf("the watchdog acted on a member it cannot tell apart: %v", err)
			case <-deadline:
				t.Fatal("partition 1 was never seen held by the twins and lagging")
			case lags := <-b.readings:
				for _, l := range lags {
					if l.Partition == 1 && l.Owner == "twin" && l.Members == 2 && l.Lag() > 0 && first.IsZero() {
						first = time.Now()
					}
				}
			}
		}
	})

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		b := setupWatchdog(t)
		wd, stalled := b.watchdog(t, "idle")
		b.consume(t, "idle", wd, func(int32) error { return nil })
		deadline := time.After(30 * time.Second)
		var caughtUp time.Time
		for caughtUp.IsZero() || time.Since(caughtUp) < 2500*time.Millisecond {
			select {
			case err := <-stalled:
				t.Fatalf("the watchdog took an idle consumer for a stall: %v", err)
			case <-deadline:
				t.Fatal("the consumer never caught up")
			case lags := <-b.readings:
				if caughtUp.IsZero() && len(lags) == 2 && lags[0].Lag() == 0 && lags[1].Lag() == 0 {
					caughtUp = time.Now()
				}
			}
		}
	})
}

// sittingHandler consumes every partition but sit, whose claim it holds
// without reading.
type sittingHandler struct{ sit int32 }

func (sittingHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (sittingHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h sittingHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	if claim.Partition() == h.sit {
		<-sess.Context().Done()
		return nil
	}
	for msg := range claim.Messages() {
		sess.MarkMessage(msg, "")
	}
	return nil
}

// commit has group "g" commit, on each partition of b's topic, the offset
// upTo gives it: a member reads up to it, marks, commits and leaves.
func (b *watchdogBundle) commit(t *testing.T, upTo map[int32]int64) {
	t.Helper()
	group, err := sarama.NewConsumerGroup(b.brokers, "g", saramaConf("committer"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	h := &markingHandler{upTo: upTo, left: len(upTo), done: cancel}
	require.NoError(t, group.Consume(ctx, []string{b.topic}, h))
	require.NoError(t, group.Close())
	require.Zero(t, h.left, "the member left before it marked every offset")
}

// markingHandler marks each partition's records below upTo, commits, and
// calls done once every partition has its offset.
type markingHandler struct {
	mu   sync.Mutex
	upTo map[int32]int64
	left int
	done func()
}

func (*markingHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*markingHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *markingHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		if msg.Offset >= h.upTo[claim.Partition()] {
			continue
		}
		sess.MarkMessage(msg, "")
		if msg.Offset+1 == h.upTo[claim.Partition()] {
			sess.Commit()
			h.mu.Lock()
			if h.left--; h.left == 0 {
				h.done()
			}
			h.mu.Unlock()
		}
	}
	return nil
}

// deleteRecords deletes the records of partition p of b's topic before offset.
func (b *watchdogBundle) deleteRecords(t *testing.T, p int32, before int64) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(b.brokers, saramaConf("admin"))
	require.NoError(t, err)
	defer admin.Close()
	require.NoError(t, admin.DeleteRecords(b.topic, map[int32]int64{p: before}))
}

// TestWatchdogSeesRecordsTheBrokerDeleted: records deleted past the group's
// committed offset are a skipped range OnSkipped is given (and extended as
// the log start moves on), and no lag: a member holding a partition whose
// every waiting record was deleted is not stalled.
func TestWatchdogSeesRecordsTheBrokerDeleted(t *testing.T) {
	t.Parallel()
	b := setupWatchdog(t)
	b.commit(t, map[int32]int64{0: 5, 1: 2})
	b.deleteRecords(t, 1, 4)
	skipped := make(chan inbox.SkippedRange, 100)
	wd, err := inboxkafka.NewWatchdog(inboxkafka.WatchdogConfig{
		Brokers: b.brokers, Sarama: saramaConf("watchdog"), Group: "g", Topic: b.topic, ClientID: "sitter",
		Timeout: time.Second, Interval: 100 * time.Millisecond,
		OnRead: func(l []inboxkafka.PartitionLag) {
			select {
			case b.readings <- l:
			default:
			}
		},
		OnSkipped: func(r inbox.SkippedRange) { skipped <- r },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stalled := make(chan error, 1)
	go func() { stalled <- wd.Run(ctx) }()
	t.Cleanup(cancel)

	next := func() inbox.SkippedRange {
		t.Helper()
		select {
		case r := <-skipped:
			return r
		case <-time.After(30 * time.Second):
			t.Fatal("no skipped range was given")
			return inbox.SkippedRange{}
		}
	}
	r := next()
	require.Equal(t, inbox.SkippedRange{Topic: b.topic, Partition: 1, From: 2, To: 4, Cause: inbox.Deleted}, r)
	require.Contains(t, r.String(), "2 records (offsets 2 to 3) were deleted before the consumer read them")
	b.deleteRecords(t, 1, 5) // every record of partition 1
	for r.To != 5 {
		r = next()
	}
	require.Equal(t, inbox.SkippedRange{Topic: b.topic, Partition: 1, From: 2, To: 5, Cause: inbox.Deleted}, r)

	// A member sits on partition 1, which has nothing left to read.
	group, err := sarama.NewConsumerGroup(b.brokers, "g", saramaConf("sitter"))
	require.NoError(t, err)
	t.Cleanup(func() { group.Close() })
	go group.Consume(ctx, []string{b.topic}, sittingHandler{sit: 1}) //nolint:errcheck // the test reads the watchdog
	deadline := time.After(30 * time.Second)
	var held time.Time
	for held.IsZero() || time.Since(held) < 2500*time.Millisecond {
		select {
		case err := <-stalled:
			t.Fatalf("the watchdog took deleted records for a stall: %v", err)
		case <-deadline:
			t.Fatal("partition 1 was never seen held")
		case lags := <-b.readings:
			for _, l := range lags {
				if l.Partition == 1 && l.Owner == "sitter" && held.IsZero() {
					require.Zero(t, l.Lag(), "deleted records are no lag: %+v", l)
					held = time.Now()
				}
			}
		}
	}
}

// TestPartitionLagSkipped: what a reading says was lost, and its lag.
func TestPartitionLagSkipped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lag     inboxkafka.PartitionLag
		skipped inbox.SkippedRange
		ok      bool
		wait    int64
	}{
		{lag: inboxkafka.PartitionLag{Committed: 3, Start: 0, End: 9}, wait: 6},
		{lag: inboxkafka.PartitionLag{Committed: -1, Start: 4, End: 9}, wait: 5}, // nothing committed: it starts at the log start
		{lag: inboxkafka.PartitionLag{Committed: 3, Start: 7, End: 9}, skipped: inbox.SkippedRange{Topic: "t", From: 3, To: 7, Cause: inbox.Deleted}, ok: true, wait: 2},
		{lag: inboxkafka.PartitionLag{Committed: 3, Start: 9, End: 9}, skipped: inbox.SkippedRange{Topic: "t", From: 3, To: 9, Cause: inbox.Deleted}, ok: true},
		{lag: inboxkafka.PartitionLag{Committed: 9, Start: 0, End: 2}, skipped: inbox.SkippedRange{Topic: "t", From: 2, To: 9, Cause: inbox.Truncated}, ok: true},
		{lag: inboxkafka.PartitionLag{Committed: 9, Start: 9, End: 9}},
	} {
		r, ok := tc.lag.Skipped("t")
		require.Equal(t, tc.ok, ok, "%+v", tc.lag)
		if ok {
			require.Equal(t, tc.skipped, r, "%+v", tc.lag)
		}
		require.Equal(t, tc.wait, tc.lag.Lag(), "%+v", tc.lag)
	}
}
