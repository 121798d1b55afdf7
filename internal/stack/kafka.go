package stack

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

	"github.com/outboxref/outbox-inbox/internal/kafkaconf"
)

// DefaultPartitions is used when KafkaOptions.Partitions is not set.
const DefaultPartitions = 6

// KafkaVersion is the Kafka protocol version every Sarama client of this
// project announces: kafkaconf.Version. V2_8_0_0 is Sarama's own default
// ("full protocol coverage"), is above the 2.1 floor that Kafka 4 still
// accepts (KIP-896 removed older request versions), and is verified against
// kfake by TestSaramaVersionsAgainstKfake.
var KafkaVersion = kafkaconf.Version

// Kafka is a Kafka-protocol broker: KAFKA_BROKERS when set, otherwise an
// in-process kfake cluster.
type Kafka struct {
	brokers []string
	cluster *kfake.Cluster // nil when external
	once    sync.Once
}

// KafkaOptions configures StartKafka.
type KafkaOptions struct {
	// Partitions for seeded / auto-created topics. Defaults to 6.
	Partitions int
	// Topics created at start (kfake.SeedTopics, or CreateTopics when
	// external). Auto-creation is on in kfake as well.
	Topics []string
	// Port of the kfake broker on 127.0.0.1; 0 picks a free one.
	Port int
	// MinSessionTimeout, if > 0, lowers kfake's minimum consumer-group
	// session timeout (kfake.GroupMinSessionTimeout, default 6s) so clients
	// may use e.g. a 1s Consumer.Group.Session.Timeout. Ignored when
	// external: there it is the broker's group.min.session.timeout.ms.
	MinSessionTimeout time.Duration
}

// KafkaBrokersFromEnv returns KAFKA_BROKERS split on commas, with blanks
// trimmed and empty entries dropped; nil when unset.
func KafkaBrokersFromEnv() []string {
	var brokers []string
	for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	return brokers
}

// StartKafka connects to KAFKA_BROKERS when set (creating opts.Topics there),
// otherwise starts a single-broker in-process kfake cluster on 127.0.0.1 with
// topic auto-creation enabled.
func StartKafka(ctx context.Context, opts KafkaOptions) (*Kafka, error) {
	partitions := opts.Partitions
	if partitions <= 0 {
		partitions = DefaultPartitions
	}
	if brokers := KafkaBrokersFromEnv(); len(brokers) > 0 {
		k := &Kafka{brokers: brokers}
		if len(opts.Topics) > 0 {
			if err := k.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
				return nil, err
			}
		}
		return k, nil
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
	c, err := kfake.NewCluster(kopts...)
	if err != nil {
		return nil, fmt.Errorf("stack: start kfake: %w", err)
	}
	return &Kafka{brokers: c.ListenAddrs(), cluster: c}, nil
}

// Brokers returns the bootstrap addresses (host:port).
func (k *Kafka) Brokers() []string { return append([]string(nil), k.brokers...) }

// External reports whether the brokers come from KAFKA_BROKERS.
func (k *Kafka) External() bool { return k.cluster == nil }

// Cluster returns the kfake cluster, e.g. to inject faults with ControlKey;
// nil when external.
func (k *Kafka) Cluster() *kfake.Cluster { return k.cluster }

// Close shuts the kfake cluster down (no-op when external). Safe to call more
// than once.
func (k *Kafka) Close() {
	if k == nil || k.cluster == nil {
		return
	}
	k.once.Do(k.cluster.Close)
}

// CreateTopics creates topics with the given number of partitions (<= 0
// means DefaultPartitions) and the broker's default replication factor,
// through the Kafka protocol (Sarama ClusterAdmin), so it works against kfake
// and real Kafka alike. Topics that already exist are not an error.
func (k *Kafka) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	if partitions <= 0 {
		partitions = DefaultPartitions
	}
	// Sarama has no context support: run it aside and stop waiting on ctx.
	done := make(chan error, 1)
	go func() {
		admin, err := sarama.NewClusterAdmin(k.brokers, SaramaConfig())
		if err != nil {
			done <- fmt.Errorf("stack: kafka admin: %w", err)
			return
		}
		defer admin.Close()
		for _, topic := range topics {
			err := admin.CreateTopic(topic, &sarama.TopicDetail{
				NumPartitions:     int32(partitions),
				ReplicationFactor: -1, // broker default (CreateTopics v4+, Kafka 2.4+)
			}, false)
			if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				done <- fmt.Errorf("stack: create topic %q: %w", topic, err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("stack: create topics: %w", ctx.Err())
	}
}

// SaramaConfig returns the Sarama config that services and tests must use,
// against kfake and real Kafka alike (see package kafkaconf). Callers may
// tweak the returned copy (group session timeouts, ClientID).
func SaramaConfig() *sarama.Config { return kafkaconf.Sarama() }
