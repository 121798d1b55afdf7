// Command kfake is CI's stand-in for the Kafka broker of docker-compose.yml.
//
// CI has no container registry, so it cannot pull apache/kafka; the CI-only
// override deploy/ci/docker-compose.ci.yml replaces the `kafka` service (and
// the `kafka-init` job that creates the topics) with an image holding only
// this binary (built by deploy/ci/standins.sh). It runs the
// same embedded Kafka-protocol broker the tests use (franz-go's kfake), on
// 0.0.0.0:9092, advertised as kafka:9092 (the compose service name), with
// the system's four topics seeded at 6 partitions each. Nothing else in the
// compose file changes: the services, the demo and their settings are what
// users run against real Kafka.
//
// Modes:
//
//	kfake                   run the broker until SIGTERM/SIGINT
//	kfake -healthcheck      exit 0 if the broker on 127.0.0.1 answers and
//	                        every topic has its partitions (container healthcheck)
//	kfake -create-topics    create the topics on $KAFKA_BROKERS through the
//	                        Kafka protocol, existing ones being fine (kafka-init)
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/outbox-inbox/internal/kafkaconf"
	"github.com/outboxref/outbox-inbox/internal/stack"
	"github.com/outboxref/outbox-inbox/internal/system"
)

func main() {
	var (
		listen      = flag.String("listen", "0.0.0.0:9092", "address to listen on")
		advertise   = flag.String("advertise", "kafka:9092", "host:port clients are told to connect to")
		partitions  = flag.Int("partitions", stack.DefaultPartitions, "partitions per seeded or auto-created topic")
		topics      = flag.String("topics", strings.Join(system.Topics, ","), "topics to seed, comma-separated")
		healthcheck = flag.Bool("healthcheck", false, "check the running broker and exit")
		create      = flag.Bool("create-topics", false, "create the topics on $KAFKA_BROKERS and exit")
	)
	flag.Parse()
	names := split(*topics)

	var err error
	switch {
	case *healthcheck:
		_, port, _ := net.SplitHostPort(*listen)
		err = check("127.0.0.1:"+port, names, *partitions)
	case *create:
		err = createTopics(names, *partitions)
	default:
		err = serve(*listen, *advertise, names, *partitions)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kfake:", err)
		os.Exit(1)
	}
}

func serve(listen, advertise string, topics []string, partitions int) error {
	c, err := start(listen, advertise, topics, partitions)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("kfake: Kafka-protocol broker on %s, advertised as %s; topics %s with %d partitions each\n",
		listen, advertise, strings.Join(topics, ", "), partitions)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	fmt.Println("kfake: stopping")
	return nil
}

// start runs a one-broker kfake cluster listening on listen and telling
// clients to connect to advertise, with topics seeded.
func start(listen, advertise string, topics []string, partitions int) (*kfake.Cluster, error) {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("-listen %q: %w", listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("-listen %q: %w", listen, err)
	}
	return kfake.NewCluster(
		kfake.Ports(p), // one broker
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			// kfake listens on 127.0.0.1 and advertises its listener's
			// address; listen on all interfaces and advertise the name the
			// other containers resolve instead.
			ln, err := net.Listen(network, listen)
			if err != nil {
				return nil, err
			}
			return advertised{ln, advertise}, nil
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
		kfake.SeedTopics(int32(partitions), topics...),
	)
}

// check connects to the broker and verifies every topic has its partitions.
func check(addr string, topics []string, partitions int) error {
	cfg := kafkaconf.Sarama()
	cfg.ClientID = "kfake-healthcheck"
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Metadata.Retry.Max = 0
	cfg.Metadata.AllowAutoTopicCreation = false // a check must not create what it checks
	client, err := sarama.NewClient([]string{addr}, cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	for _, t := range topics {
		ps, err := client.Partitions(t)
		if err != nil {
			return fmt.Errorf("topic %s: %w", t, err)
		}
		if len(ps) < partitions {
			return fmt.Errorf("topic %s has %d partitions, want %d", t, len(ps), partitions)
		}
	}
	return nil
}

func createTopics(topics []string, partitions int) error {
	brokers := stack.KafkaBrokersFromEnv()
	if len(brokers) == 0 {
		return fmt.Errorf("-create-topics: KAFKA_BROKERS is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := stack.StartKafka(ctx, stack.KafkaOptions{Partitions: partitions, Topics: topics}) // external: creates them
	if err != nil {
		return err
	}
	defer k.Close()
	fmt.Printf("kfake: topics %s exist on %s\n", strings.Join(topics, ", "), strings.Join(brokers, ","))
	return nil
}

// advertised is a listener whose address is the advertised host:port.
type advertised struct {
	net.Listener
	addr string
}

func (a advertised) Addr() net.Addr { return hostPort(a.addr) }

type hostPort string

func (h hostPort) Network() string { return "tcp" }
func (h hostPort) String() string  { return string(h) }

func split(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}
