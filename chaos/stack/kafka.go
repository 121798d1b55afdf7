package stack

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// DefaultPartitions is used when KafkaOptions.Partitions is not set.
const DefaultPartitions = kafkatest.DefaultPartitions

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
	test    *kafkatest.Broker     // the embedded broker or KAFKA_BROKERS, or nil
	apache  *ApacheCluster        // the real broker, or nil
	admin   kafkaconf.Credentials // the harness's login; empty when the broker asks for none
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
func KafkaBrokersFromEnv() []string { return kafkatest.BrokersFromEnv() }

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
	impl, nodes, err := opts.impl()
	if err != nil {
		return nil, err
	}
	if len(KafkaBrokersFromEnv()) > 0 { // external: the harness logs in as KAFKA_SASL_* says
		admin, err := kafkaconf.CredentialsFromEnv()
		if err != nil {
			return nil, fmt.Errorf("stack: %w", err)
		}
		// The process's clients log in as this broker wants (or not at
		// all), whatever a broker started before it wanted.
		kafkaconf.UseCredentials(admin)
		b, err := kafkatest.Start(ctx, kafkatest.Options{Partitions: partitions})
		if err != nil {
			return nil, err
		}
		k := &Kafka{brokers: b.Brokers(), test: b, admin: admin}
		if len(opts.Topics) > 0 {
			if err := k.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
				return nil, err
			}
		}
		return k, nil
	}
	admin := AdminCredentials()
	kafkaconf.UseCredentials(admin)
	if impl == ImplApache {
		aopts := opts.Apache
		aopts.Nodes, aopts.Partitions, aopts.MinSessionTimeout = nodes, partitions, opts.MinSessionTimeout
		c, err := StartApache(ctx, aopts)
		if err != nil {
			return nil, err
		}
		k := &Kafka{brokers: c.Brokers(), apache: c, admin: admin}
		if len(opts.Topics) > 0 {
			if err := k.CreateTopics(ctx, partitions, opts.Topics...); err != nil {
				c.Close()
				return nil, err
			}
		}
		return k, nil
	}
	b, err := kafkatest.Start(ctx, kafkatest.Options{
		Partitions: partitions, Topics: opts.Topics, Port: opts.Port, MinSessionTimeout: opts.MinSessionTimeout,
		Superuser: kafkatest.Login{User: admin.Username, Password: admin.Password},
	})
	if err != nil {
		return nil, err
	}
	return &Kafka{brokers: b.Brokers(), test: b, admin: admin}, nil
}

// Brokers returns the bootstrap addresses (host:port).
func (k *Kafka) Brokers() []string { return append([]string(nil), k.brokers...) }

// External reports whether the brokers come from KAFKA_BROKERS.
func (k *Kafka) External() bool { return k.apache == nil && k.test.External() }

// Cluster returns the kfake cluster, e.g. to inject faults with ControlKey;
// nil when external or Apache.
func (k *Kafka) Cluster() *kfake.Cluster {
	if k.test == nil {
		return nil
	}
	return k.test.Cluster()
}

// Apache returns the Apache Kafka cluster, e.g. to kill or pause its nodes;
// nil when external or kfake.
func (k *Kafka) Apache() *ApacheCluster { return k.apache }

// Describe names the broker for logs and reports: "kfake (embedded)",
// "Apache Kafka 4.1.0 (3 nodes)" or "external (KAFKA_BROKERS)".
func (k *Kafka) Describe() string {
	switch {
	case k.apache != nil:
		return fmt.Sprintf("Apache Kafka %s (%d node(s), JVMs from Maven Central jars)", ApacheVersion, len(k.apache.nodes))
	case k.Cluster() != nil:
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
		k.test.Close()
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
	return kafkatest.CreateTopics(ctx, k.DirectBrokers(), SaramaConfig(), partitions, config, topics...)
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
