package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// The Postgres server and the Kafka broker every test and example of this
// package runs against: a throwaway cluster and an in-process kfake broker,
// or DATABASE_URL and KAFKA_BROKERS when set. Each test takes a fresh
// database and fresh topics, so tests share nothing else.
var (
	testPG    *pgtest.Server
	testKafka *kafkatest.Broker
)

func TestMain(m *testing.M) {
	if os.Getenv(relayChildEnv) != "" {
		os.Exit(runRelayChild()) // relayprocs_test.go: this binary is one relay process
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// The tests spend their time waiting for fsync and for the broker, not
	// on the CPU: unless -parallel was given, run more of them at once than
	// the default GOMAXPROCS.
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if p := flag.Lookup("test.parallel"); !parallelSet && p != nil && runtime.GOMAXPROCS(0) < 4 {
		_ = p.Value.Set("4")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		log.Print(err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck // the temp dir goes either way
	k, err := kafkatest.Start(ctx, kafkatest.Options{})
	if err != nil {
		log.Print(err)
		return 1
	}
	defer k.Close()
	testPG, testKafka = pg, k
	// The examples find their database and broker the way a reader's program
	// would, in DATABASE_URL and KAFKA_BROKERS: one database for them all
	// (each example keeps to tables and topics of its own). Set only now:
	// pgtest.Start and kafkatest.Start read the same variables.
	name := fmt.Sprintf("outbox_examples_%d_%s", os.Getpid(), randomSuffix())
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		log.Print(err)
		return 1
	}
	pg.DropAtStop(name)
	if err := errors.Join(os.Setenv("DATABASE_URL", url), os.Setenv("KAFKA_BROKERS", strings.Join(k.Brokers(), ","))); err != nil {
		log.Print(err)
		return 1
	}
	return m.Run()
}

const (
	// partitions of every test topic: enough that keys spread out.
	partitions = 6
	// waitTimeout bounds every wait on the database or the broker.
	waitTimeout = 20 * time.Second
)

var nameSeq atomic.Int64

// uniqueName returns a name that is a valid Postgres database and Kafka topic
// name, unique within this run and, through a random suffix, across runs
// against a long-lived DATABASE_URL or KAFKA_BROKERS.
func uniqueName(t testing.TB) string {
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, strings.ToLower(t.Name()))
	prefix := fmt.Sprintf("outbox_%d_", nameSeq.Add(1))
	suffix := "_" + randomSuffix()
	if max := 63 - len(prefix) - len(suffix); len(base) > max {
		base = base[len(base)-max:] // the end of a subtest name is the distinctive part
	}
	return prefix + base + suffix
}

// randomSuffix returns six random hex digits.
func randomSuffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newPool returns a pool on a fresh, migrated database.
func newPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	name := uniqueName(t)
	url, err := testPG.CreateDatabase(ctx, name)
	require.NoError(t, err)
	testPG.DropWhenDone(t, name)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 20 // producers, relays and their listeners at once
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(ctx, pool))
	return pool
}

// newTopic creates a fresh topic, so a consumer can subscribe before the
// first message is produced.
func newTopic(t testing.TB) string {
	t.Helper()
	topic := uniqueName(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, testKafka.CreateTopics(ctx, partitions, topic))
	return topic
}

// newPublisher returns the publisher the services give the relay: Sarama
// with the project's config, the partition key as the Kafka record key.
func newPublisher(t testing.TB) *kafka.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               testKafka.Brokers(),
		Marshaler:             kafka.NewWithPartitioningMarshaler(outbox.PartitionKey),
		OverwriteSaramaConfig: kafkatest.Sarama(),
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return pub
}

// newBatchPublisher returns outboxkafka's batching publisher, on the same
// config.
func newBatchPublisher(t testing.TB) *outboxkafka.Publisher {
	t.Helper()
	pub, err := outboxkafka.New(outboxkafka.Config{Brokers: testKafka.Brokers(), Sarama: kafkatest.Sarama(), Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pub.Close()) })
	return pub
}

// newRelay returns a relay for cfg, failing the test on a config error.
func newRelay(t testing.TB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	relay, err := outbox.NewRelay(cfg)
	require.NoError(t, err)
	return relay
}

// running is a relay whose Run was started by startRelay.
type running struct {
	cancel   context.CancelFunc
	canceled atomic.Pointer[time.Time]
	done     chan struct{} // closed when Run returned
	err      error         // what Run returned
	stuck    atomic.Bool   // Wait timed out once; don't wait again
}

// startRelay runs relay until the test ends or Stop is called, and checks
// that Run then returns nil.
func startRelay(t testing.TB, relay *outbox.Relay) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = relay.Run(ctx)
	}()
	t.Cleanup(func() { r.Stop(t) })
	return r
}

// Cancel ends Run's context without waiting.
func (r *running) Cancel() {
	now := time.Now()
	r.canceled.CompareAndSwap(nil, &now)
	r.cancel()
}

// Wait waits for Run to return after Cancel, requires nil, and returns how
// long Run took to return after the cancel.
func (r *running) Wait(t testing.TB) time.Duration {
	t.Helper()
	if r.stuck.Load() {
		t.Fatal("Run did not return after its context ended")
	}
	select {
	case <-r.done:
	case <-time.After(waitTimeout):
		r.stuck.Store(true)
		t.Fatalf("Run did not return %v after its context ended", waitTimeout)
	}
	require.NoError(t, r.err, "Run must return nil on shutdown")
	return time.Since(*r.canceled.Load())
}

// Stop cancels Run and waits for it; see Wait.
func (r *running) Stop(t testing.TB) time.Duration {
	t.Helper()
	r.Cancel()
	return r.Wait(t)
}

// eventually polls cond every 20ms until it holds, and fails the test if it
// does not within timeout. Unlike require.Eventually it calls cond on the
// test goroutine, so cond may use require.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			require.Fail(t, "condition not met within "+timeout.String(), msgAndArgs...)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishCommitted writes msgs to topic in one committed transaction.
func publishCommitted(t testing.TB, pool *pgxpool.Pool, topic string, msgs ...*message.Message) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		return outbox.PublishTx(context.Background(), tx, topic, msgs...)
	})
	require.NoError(t, err)
}

// countRows counts outbox rows matching where (an SQL condition).
func countRows(t testing.TB, pool *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM outbox_messages WHERE `+where).Scan(&n))
	return n
}

// sink reads every record of its topics from the start, with a plain kgo
// client (no consumer group, no offsets committed), so a test sees exactly
// what reached the broker, duplicates included.
type sink struct {
	mu      sync.Mutex
	records []*kgo.Record // in arrival order; per partition that is offset order
}

func newSink(t testing.TB, topics ...string) *sink {
	t.Helper()
	client, err := kgo.NewClient(
		kgo.SeedBrokers(testKafka.Brokers()...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	require.NoError(t, err)
	s := &sink{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fetches := client.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			s.records = append(s.records, fetches.Records()...)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		client.Close()
	})
	return s
}

// Records returns a copy of what arrived so far.
func (s *sink) Records() []*kgo.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*kgo.Record(nil), s.records...)
}

// Len is how many records arrived.
func (s *sink) Len() int { return len(s.Records()) }

// Counts returns how often each message id arrived.
func (s *sink) Counts() map[string]int {
	counts := map[string]int{}
	for _, r := range s.Records() {
		counts[messageID(r)]++
	}
	return counts
}

// WaitFor waits until every id in ids arrived at least once.
func (s *sink) WaitFor(t testing.TB, ids []string) {
	t.Helper()
	var missing int
	ok := false
	for deadline := time.Now().Add(waitTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		counts := s.Counts()
		missing = 0
		for _, id := range ids {
			if counts[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			ok = true
			break
		}
	}
	require.True(t, ok, "%d of %d messages never reached Kafka", missing, len(ids))
}

// messageID is the Watermill message id the record carries in its header.
func messageID(r *kgo.Record) string {
	return header(r, kafka.UUIDHeaderKey)
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// ids returns the message ids of msgs.
func ids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}
