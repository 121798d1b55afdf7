package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
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

// Kafka is a Kafka-protocol broker: KAFKA_BROKERS when set, otherwise
// Apache Kafka from its jars (STACK_KAFKA=apache) or an in-process kfake
// cluster (the default).
type Kafka struct {
	brokers []string
	cluster *kfake.Cluster // the embedded broker, or nil
	apache  *ApacheCluster // the real broker, or nil
	once    sync.Once
}

// The brokers StartKafka can start, chosen by KafkaOptions.Impl or
// STACK_KAFKA.
const (
	ImplKfake  = "kfake"  // franz-go's in-process fake: fast, no Java
	ImplApache = "apache" // Apache Kafka's broker, JVMs from Maven Central jars
)

// KafkaOptions configures StartKafka.
type KafkaOptions struct {
	// Partitions for seeded / auto-created topics. Defaults to 6.
	Partitions int
	// Topics created at start (kfake.SeedTopics, or CreateTopics when
	// external). Auto-creation is on in kfake as well.
	Topics []string
	// Port of the kfake broker on 127.0.0.1; 0 picks a free one.
	Port int
	// MinSessionTimeout, if > 0, lowers the broker's minimum consumer-group
	// session timeout (kfake.GroupMinSessionTimeout, Apache Kafka's
	// group.min.session.timeout.ms; 6s by default in both) so clients may
	// use e.g. a 1s Consumer.Group.Session.Timeout. Ignored when external.
	MinSessionTimeout time.Duration
	// Impl is ImplKfake or ImplApache. Defaults to $STACK_KAFKA, then kfake.
	Impl string
	// Nodes of an Apache cluster. Defaults to $STACK_KAFKA_NODES, then 1.
	Nodes int
	// Apache holds the rest of an Apache cluster's options; its Nodes,
	// Partitions and MinSessionTimeout are taken from the fields above.
	Apache ApacheOptions
}

// impl returns the chosen broker and node count, or an error naming the bad
// value.
func (o KafkaOptions) impl() (string, int, error) {
	impl := o.Impl
	if impl == "" {
		impl = strings.TrimSpace(os.Getenv("STACK_KAFKA"))
	}
	if impl == "" {
		impl = ImplKfake
	}
	if impl != ImplKfake && impl != ImplApache {
		return "", 0, fmt.Errorf("stack: STACK_KAFKA=%q: want %q or %q", impl, ImplKfake, ImplApache)
	}
	nodes := o.Nodes
	if nodes == 0 {
		if env := strings.TrimSpace(os.Getenv("STACK_KAFKA_NODES")); env != "" {
			n, err := strconv.Atoi(env)
			if err != nil || n < 1 {
				return "", 0, fmt.Errorf("stack: STACK_KAFKA_NODES=%q: want a positive number", env)
			}
			nodes = n
		}
	}
	return impl, max(1, nodes), nil
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

// StartKafka connects to KAFKA_BROKERS when set (creating opts.Topics
// there). Otherwise it starts the broker opts.Impl names: Apache Kafka from
// its jars (StartApache; topics created with the cluster's replication), or,
// by default, a single-broker in-process kfake cluster on 127.0.0.1 with
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
	impl, nodes, err := opts.impl()
	if err != nil {
		return nil, err
	}
	if impl == ImplApache {
		aopts := opts.Apache
		aopts.Nodes, aopts.Partitions, aopts.MinSessionTimeout = nodes, partitions, opts.MinSessionTimeout
		c, err := StartApache(ctx, aopts)
		if err != nil {
			return nil, err
		}
		k := &Kafka{brokers: c.Brokers(), apache: c}
		if len(opts.Topics) > 0 {
			if err := k.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
				c.Close()
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
func (k *Kafka) External() bool { return k.cluster == nil && k.apache == nil }

// Cluster returns the kfake cluster, e.g. to inject faults with ControlKey;
// nil when external or Apache.
func (k *Kafka) Cluster() *kfake.Cluster { return k.cluster }

// Apache returns the Apache Kafka cluster, e.g. to kill or pause its nodes;
// nil when external or kfake.
func (k *Kafka) Apache() *ApacheCluster { return k.apache }

// Describe names the broker for logs and reports: "kfake (embedded)",
// "Apache Kafka 4.1.0 (3 nodes)" or "external (KAFKA_BROKERS)".
func (k *Kafka) Describe() string {
	switch {
	case k.apache != nil:
		return fmt.Sprintf("Apache Kafka %s (%d node(s), JVMs from Maven Central jars)", ApacheVersion, len(k.apache.nodes))
	case k.cluster != nil:
		return "kfake (embedded, franz-go)"
	default:
		return "external (KAFKA_BROKERS)"
	}
}

// Close shuts the started broker down (no-op when external). Safe to call
// more than once.
func (k *Kafka) Close() {
	if k == nil {
		return
	}
	k.once.Do(func() {
		if k.cluster != nil {
			k.cluster.Close()
		}
		k.apache.Close()
	})
}

// CreateTopics creates topics with the given number of partitions (<= 0
// means DefaultPartitions) and the broker's default replication factor,
// through the Kafka protocol (Sarama ClusterAdmin), so it works against kfake
// and real Kafka alike. Topics that already exist are not an error.
func (k *Kafka) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	return k.CreateTopicsWithConfig(ctx, partitions, nil, topics...)
}

// CreateTopicsWithConfig is CreateTopics with topic configs (for example
// max.message.bytes).
func (k *Kafka) CreateTopicsWithConfig(ctx context.Context, partitions int, config map[string]string, topics ...string) error {
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
		admin, err := sarama.NewClusterAdmin(k.DirectBrokers(), SaramaConfig())
		if err != nil {
			done <- fmt.Errorf("stack: kafka admin: %w", err)
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
				done <- fmt.Errorf("stack: create topic %q: %w", topic, err)
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
		return fmt.Errorf("stack: create topics: %w", ctx.Err())
	}
}

// topicsReady reports whether the metadata lists every topic with all its
// partitions led; err says what is still missing.
func topicsReady(admin sarama.ClusterAdmin, topics []string) (bool, error) {
	meta, err := admin.DescribeTopics(topics)
	if err != nil {
		return false, fmt.Errorf("stack: describe topics: %w", err)
	}
	for _, t := range meta {
		if t.Err != sarama.ErrNoError || len(t.Partitions) == 0 {
			return false, fmt.Errorf("stack: topic %q not ready: %v, %d partitions", t.Name, t.Err, len(t.Partitions))
		}
		for _, p := range t.Partitions {
			if p.Err != sarama.ErrNoError || p.Leader < 0 {
				return false, fmt.Errorf("stack: topic %q partition %d not ready: %v, leader %d", t.Name, p.ID, p.Err, p.Leader)
			}
		}
	}
	return true, nil
}

// DirectBrokers are the addresses for a harness's own clients: an Apache
// cluster's INTERNAL listeners, which no test proxy stands in front of;
// Brokers otherwise.
func (k *Kafka) DirectBrokers() []string {
	if k.apache != nil {
		return k.apache.InternalBrokers()
	}
	return k.brokers
}

// SaramaConfig returns the Sarama config that services and tests must use,
// against kfake and real Kafka alike (see package kafkaconf). Callers may
// tweak the returned copy (group session timeouts, ClientID).
func SaramaConfig() *sarama.Config { return kafkaconf.Sarama() }
