package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func equal[T comparable](t testing.TB, want, got T) {
	t.Helper()
	if want != got {
		t.Fatalf("want %v, got %v", want, got)
	}
}

func check(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Fatalf(format, args...)
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// keyMarshaler puts msg.Metadata["key"] in the Kafka record key.
var keyMarshaler = kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
	return msg.Metadata.Get("key"), nil
})

func newPublisher(t *testing.T, k *Kafka) *kafka.Publisher {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               k.Brokers(),
		Marshaler:             keyMarshaler,
		OverwriteSaramaConfig: SaramaConfig(),
	}, watermill.NopLogger{})
	must(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func newSubscriber(t *testing.T, k *Kafka, group string, cfg *sarama.Config) *kafka.Subscriber {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               k.Brokers(),
		Unmarshaler:           keyMarshaler,
		ConsumerGroup:         group,
		OverwriteSaramaConfig: cfg,
	}, watermill.NopLogger{})
	must(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// publishN publishes n keyed messages and returns their UUIDs.
func publishN(t *testing.T, pub *kafka.Publisher, topic, prefix string, n int) map[string]bool {
	want := make(map[string]bool, n)
	for i := 0; i < n; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"i":%d}`, i)))
		msg.Metadata.Set("key", fmt.Sprintf("%s-key-%d", prefix, i))
		must(t, pub.Publish(topic, msg))
		want[msg.UUID] = true
	}
	return want
}

// collector acks everything coming out of subscriber channels and records
// which subscriber (index) got which UUID.
type collector struct {
	mu     sync.Mutex
	got    map[string]int // UUID -> subscriber index
	byIdx  map[int]int    // subscriber index -> messages received
	change chan struct{}  // signalled on every new message
}

func newCollector() *collector {
	return &collector{got: map[string]int{}, byIdx: map[int]int{}, change: make(chan struct{}, 1)}
}

func (c *collector) consume(idx int, msgs <-chan *message.Message) {
	for msg := range msgs {
		c.mu.Lock()
		c.got[msg.UUID] = idx
		c.byIdx[idx]++
		c.mu.Unlock()
		msg.Ack()
		select {
		case c.change <- struct{}{}:
		default:
		}
	}
}

// wait blocks until every UUID in want was received, or ctx expires.
func (c *collector) wait(ctx context.Context, want map[string]bool) error {
	for {
		c.mu.Lock()
		missing := 0
		for id := range want {
			if _, ok := c.got[id]; !ok {
				missing++
			}
		}
		c.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-c.change:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages missing: %w", missing, len(want), ctx.Err())
		}
	}
}

func (c *collector) count(idx int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byIdx[idx]
}

func TestKafkaWatermillRoundTrip(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	const topic = "stack-roundtrip"

	k, err := StartKafka(ctx, KafkaOptions{Topics: []string{topic}})
	must(t, err)
	t.Cleanup(k.Close)
	check(t, len(k.Brokers()) > 0, "no brokers")
	equal(t, k.External(), k.Cluster() == nil && k.Apache() == nil)

	// CreateTopics: seeded topic already exists (ignored), new one created.
	must(t, k.CreateTopics(ctx, 3, topic, "stack-created"))
	if c := k.Cluster(); c != nil {
		equal(t, DefaultPartitions, len(c.PartitionInfos(topic)))
		equal(t, 3, len(c.PartitionInfos("stack-created")))
	}

	start := time.Now()
	pub := newPublisher(t, k)
	want := publishN(t, pub, topic, "rt", 20)

	sub := newSubscriber(t, k, "stack-roundtrip-group", SaramaConfig())
	msgs, err := sub.Subscribe(ctx, topic)
	must(t, err)
	col := newCollector()
	go col.consume(0, msgs)
	must(t, col.wait(ctx, want))
	t.Logf("20 messages published and consumed in %v", time.Since(start))
}

// TestKafkaConsumerGroupShortSession runs two watermill subscribers in one
// group with a 1s session timeout, which kfake only accepts when
// MinSessionTimeout is lowered (its default minimum is 6s).
func TestKafkaConsumerGroupShortSession(t *testing.T) {
	ctx := testCtx(t, 2*time.Minute)
	const topic, group = "stack-group", "stack-group-g"

	k, err := StartKafka(ctx, KafkaOptions{Topics: []string{topic}, MinSessionTimeout: 500 * time.Millisecond})
	must(t, err)
	t.Cleanup(k.Close)

	shortSession := func() *sarama.Config {
		cfg := SaramaConfig()
		cfg.Consumer.Group.Session.Timeout = time.Second
		cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
		cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
		return cfg
	}

	start := time.Now()
	col := newCollector()
	var cancels []context.CancelFunc
	for i := 0; i < 2; i++ {
		sub := newSubscriber(t, k, group, shortSession())
		subCtx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		msgs, err := sub.Subscribe(subCtx, topic)
		must(t, err)
		go col.consume(i, msgs)
	}
	if c := k.Cluster(); c != nil {
		info, err := c.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool {
			return g != nil && g.State == "Stable" && len(g.Members) == 2 && g.NumAssigned() == DefaultPartitions
		})
		must(t, err)
		for _, m := range info.Members {
			check(t, m.NumAssigned() == DefaultPartitions/2, "member %s has %d partitions", m.MemberID, m.NumAssigned())
		}
		t.Logf("group stable with 2 members after %v", time.Since(start))
	}

	pub := newPublisher(t, k)
	want := publishN(t, pub, topic, "g1", 60)
	must(t, col.wait(ctx, want))
	check(t, col.count(0) > 0, "subscriber 0 got nothing")
	check(t, col.count(1) > 0, "subscriber 1 got nothing")
	t.Logf("phase 1: 60 messages split %d/%d, %v since start", col.count(0), col.count(1), time.Since(start))

	// Subscriber 1 leaves: subscriber 0 must take over all partitions.
	cancels[1]()
	if c := k.Cluster(); c != nil {
		_, err := c.WaitGroupInfo(ctx, group, func(g *kfake.GroupInfo) bool {
			return g != nil && g.State == "Stable" && len(g.Members) == 1 && g.NumAssigned() == DefaultPartitions
		})
		must(t, err)
	}
	before := col.count(0)
	want = publishN(t, pub, topic, "g2", 60)
	must(t, col.wait(ctx, want))
	check(t, col.count(0)-before >= 60, "subscriber 0 got %d of 60", col.count(0)-before)
	t.Logf("phase 2: subscriber 0 took over, total %v", time.Since(start))
	cancels[0]()
}

// TestKfakeRejectsShortSessionByDefault documents why MinSessionTimeout
// exists: without it kfake rejects a 1s session timeout.
func TestKfakeRejectsShortSessionByDefault(t *testing.T) {
	if len(KafkaBrokersFromEnv()) > 0 {
		t.Skip("kfake only")
	}
	ctx := testCtx(t, time.Minute)
	k, err := StartKafka(ctx, KafkaOptions{Topics: []string{"t"}})
	must(t, err)
	t.Cleanup(k.Close)

	cfg := SaramaConfig()
	cfg.Consumer.Group.Session.Timeout = time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	cg, err := sarama.NewConsumerGroup(k.Brokers(), "short", cfg)
	must(t, err)
	defer cg.Close()
	err = cg.Consume(ctx, []string{"t"}, nopHandler{})
	check(t, errors.Is(err, sarama.ErrInvalidSessionTimeout), "want ErrInvalidSessionTimeout, got %v", err)
}

type nopHandler struct{}

func (nopHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (nopHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (nopHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
	}
	return nil
}

// TestSaramaVersionsAgainstKfake produces, consumes in a group, commits and
// creates a topic with a range of Sarama protocol versions against kfake.
func TestSaramaVersionsAgainstKfake(t *testing.T) {
	if len(KafkaBrokersFromEnv()) > 0 {
		t.Skip("kfake only")
	}
	versions := []sarama.KafkaVersion{
		sarama.V2_1_0_0, sarama.V2_4_0_0, sarama.V2_8_0_0, sarama.V3_0_0_0,
		sarama.V3_6_0_0, sarama.V3_9_0_0, sarama.V4_0_0_0, sarama.MaxVersion,
	}
	for _, v := range versions {
		t.Run(v.String(), func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t, time.Minute)
			k, err := StartKafka(ctx, KafkaOptions{})
			must(t, err)
			t.Cleanup(k.Close)

			cfg := SaramaConfig()
			cfg.Version = v

			admin, err := sarama.NewClusterAdmin(k.Brokers(), cfg)
			must(t, err)
			must(t, admin.CreateTopic("v", &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: -1}, false))
			must(t, admin.Close())

			prod, err := sarama.NewSyncProducer(k.Brokers(), cfg)
			must(t, err)
			const n = 10
			for i := 0; i < n; i++ {
				_, _, err := prod.SendMessage(&sarama.ProducerMessage{
					Topic: "v", Key: sarama.StringEncoder(fmt.Sprint("k", i)), Value: sarama.StringEncoder("x"),
				})
				must(t, err)
			}
			must(t, prod.Close())

			cg, err := sarama.NewConsumerGroup(k.Brokers(), "vg", cfg)
			must(t, err)
			h := &countHandler{n: n, done: make(chan struct{})}
			cctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				for cctx.Err() == nil {
					if err := cg.Consume(cctx, []string{"v"}, h); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			select {
			case <-h.done:
			case err := <-errc:
				t.Fatalf("consume: %v", err)
			case <-ctx.Done():
				t.Fatalf("timeout: got %d of %d", h.count(), n)
			}
			cancel()
			must(t, <-errc)
			must(t, cg.Close()) // commits marked offsets

			info := k.Cluster().GroupInfo("vg")
			check(t, info != nil, "group vg unknown to kfake")
			var committed int64
			for _, c := range info.Commits["v"] {
				committed += c.Offset
			}
			equal(t, int64(n), committed)
		})
	}
}

type countHandler struct {
	mu   sync.Mutex
	n, c int
	done chan struct{}
}

func (h *countHandler) count() int { h.mu.Lock(); defer h.mu.Unlock(); return h.c }

func (*countHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (*countHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *countHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		s.MarkMessage(m, "")
		h.mu.Lock()
		h.c++
		if h.c == h.n {
			close(h.done)
		}
		h.mu.Unlock()
	}
	return nil
}
