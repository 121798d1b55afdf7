// Package kafkatest gives tests a Kafka-protocol broker: the one
// KAFKA_BROKERS names, or, without it, an in-process kfake cluster
// (franz-go's fake: the real Kafka protocol, no Java, started in
// milliseconds), closed at the end. The library's own tests run on it, and
// so can the tests of a program that imports the library:
//
//	kfk, err := kafkatest.Start(kafkatest.Options{Partitions: 3})
//	…
//	defer kfk.Close()
//	err = kfk.CreateTopics(ctx, 3, "orders.events")
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		Brokers: kfk.Brokers(), OverwriteSaramaConfig: kafkatest.Sarama(), …
//	}, logger)
package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// DefaultPartitions is used when a partition count is not given.
const DefaultPartitions = 6

// Version is the Kafka protocol version of Sarama() clients: above the 2.1
// floor Kafka 4 accepts, and one kfake serves.
var Version = sarama.V2_8_0_0

// Sarama returns a fresh Sarama config for tests: Version, producers that
// return successes, consumer groups that start at the oldest offset (nothing
// published before a test's consumer joined is skipped).
func Sarama() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = Version
	c.Producer.Return.Successes = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}

// Options configures Start.
type Options struct {
	// Partitions of seeded and auto-created topics. Defaults to
	// DefaultPartitions.
	Partitions int
	// Topics created at start.
	Topics []string
	// Port of the kfake broker on 127.0.0.1; 0 picks a free one.
	Port int
	// MinSessionTimeout, if > 0, lowers kfake's minimum consumer-group
	// session timeout (6s by default), so clients may use a shorter one.
	MinSessionTimeout time.Duration
	// Superuser, when its User is set, makes the broker authenticate every
	// connection (SASL/SCRAM-SHA-512) and authorize every request by ACL:
	// this login may do anything; any other needs a user and ACLs created
	// through the Kafka admin API (AlterUserScramCredentials, CreateACLs),
	// as on a real cluster. Ignored when external.
	Superuser Login
}

// Login is a SASL/SCRAM-SHA-512 username and password.
type Login struct{ User, Password string }

// Broker is a running Kafka-protocol broker.
type Broker struct {
	brokers []string
	cluster *kfake.Cluster // nil when external
	once    sync.Once
}

// BrokersFromEnv returns KAFKA_BROKERS split on commas, blanks trimmed and
// empty entries dropped; nil when unset.
func BrokersFromEnv() []string {
	var brokers []string
	for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return brokers
}

// Start connects to KAFKA_BROKERS when set (creating opts.Topics there),
// otherwise starts a single-broker kfake cluster on 127.0.0.1 with topic
// auto-creation on.
func Start(ctx context.Context, opts Options) (*Broker, error) {
	partitions := opts.Partitions
	if partitions <= 0 {
		partitions = DefaultPartitions
	}
	if brokers := BrokersFromEnv(); len(brokers) > 0 {
		b := &Broker{brokers: brokers}
		if len(opts.Topics) > 0 {
			if err := b.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
				return nil, err
			}
		}
		return b, nil
	}
	kopts := []kfake.Opt{
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
	}
	if opts.Port > 0 {
		kopts = append(kopts, kfake.Ports(opts.Port)) // also sets 1 broker
	} else {
		kopts = append(kopts, kfake.NumBrokers(1))
	}
	if len(opts.Topics) > 0 {
		kopts = append(kopts, kfake.SeedTopics(int32(partitions), opts.Topics...))
	}
	if opts.MinSessionTimeout > 0 {
		kopts = append(kopts, kfake.GroupMinSessionTimeout(opts.MinSessionTimeout))
	}
	if opts.Superuser.User != "" {
		kopts = append(kopts, kfake.EnableSASL(), kfake.EnableACLs(),
			kfake.Superuser("SCRAM-SHA-512", opts.Superuser.User, opts.Superuser.Password))
	}
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: starting kfake: %w", err)
	}
	return &Broker{brokers: c.ListenAddrs(), cluster: c}, nil
}

// Brokers returns the bootstrap addresses (host:port).
func (b *Broker) Brokers() []string { return append([]string(nil), b.brokers...) }

// External reports whether the brokers come from KAFKA_BROKERS.
func (b *Broker) External() bool { return b.cluster == nil }

// Cluster returns the kfake cluster, e.g. to inject faults with ControlKey;
// nil when external.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close shuts a started kfake cluster down (no-op when external). Safe to
// call more than once.
func (b *Broker) Close() {
	if b == nil {
		return
	}
	b.once.Do(func() {
		if b.cluster != nil {
			b.cluster.Close()
		}
	})
}

// CreateTopics creates topics with the given number of partitions (<= 0
// means DefaultPartitions). Topics that already exist are not an error.
func (b *Broker) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	return CreateTopics(ctx, b.brokers, Sarama(), partitions, nil, topics...)
}

// CreateTopicsWithConfig is CreateTopics with topic configs (for example
// max.message.bytes).
func (b *Broker) CreateTopicsWithConfig(ctx context.Context, partitions int, config map[string]string, topics ...string) error {
	return CreateTopics(ctx, b.brokers, Sarama(), partitions, config, topics...)
}

// CreateTopics creates topics on brokers with the given number of partitions
// (<= 0 means DefaultPartitions), the broker's default replication factor
// and config, through the Kafka protocol (Sarama's ClusterAdmin), so it works
// against kfake and real Kafka alike, and returns once every partition has a
// leader. Topics that already exist are not an error.
func CreateTopics(ctx context.Context, brokers []string, conf *sarama.Config, partitions int, config map[string]string, topics ...string) error {
	entries := map[string]*string{}
	for name, v := range config {
		entries[name] = &v
	}
	if partitions <= 0 {
		partitions = DefaultPartitions
	}
	// Sarama has no context support: run it aside and stop waiting on ctx.
	done := make(chan error, 1)
	go func() {
		admin, err := sarama.NewClusterAdmin(brokers, conf)
		if err != nil {
			done <- fmt.Errorf("kafkatest: kafka admin: %w", err)
			return
		}
		defer admin.Close()
		for _, topic := range topics {
			err := admin.CreateTopic(topic, &sarama.TopicDetail{
				NumPartitions:     int32(partitions),
				ReplicationFactor: -1, // broker default (CreateTopics v4+, Kafka 2.4+)
				ConfigEntries:     entries,
			}, false)
			if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				done <- fmt.Errorf("kafkatest: create topic %q: %w", topic, err)
				return
			}
		}
		// A real cluster answers CreateTopics once its controller committed
		// them; the brokers learn of them a little later. Return when the
		// metadata shows every partition with a leader (a loaded CI machine
		// described a just-created topic with no partitions).
		for {
			ready, err := topicsReady(admin, topics)
			if ready || ctx.Err() != nil {
				done <- err
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("kafkatest: create topics: %w", ctx.Err())
	}
}

// topicsReady reports whether the metadata lists every topic with all its
// partitions led; err says what is still missing.
func topicsReady(admin sarama.ClusterAdmin, topics []string) (bool, error) {
	meta, err := admin.DescribeTopics(topics)
	if err != nil {
		return false, fmt.Errorf("kafkatest: describe topics: %w", err)
	}
	for _, t := range meta {
		if t.Err != sarama.ErrNoError || len(t.Partitions) == 0 {
			return false, fmt.Errorf("kafkatest: topic %q not ready: %v, %d partitions", t.Name, t.Err, len(t.Partitions))
		}
		for _, p := range t.Partitions {
			if p.Err != sarama.ErrNoError || p.Leader < 0 {
				return false, fmt.Errorf("kafkatest: topic %q partition %d not ready: %v, leader %d", t.Name, p.ID, p.Err, p.Leader)
			}
		}
	}
	return true, nil
}
