package platform

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// consumer is the Kafka consumer in front of the inbox: the router that
// hands its messages to the inbox, and its feeds.
type consumer struct {
	router *message.Router
	feeds  []feed
}

// feed is one topic the consumer reads, in a consumer group of its own:
// watermill-kafka's subscriber, and the watchdog that notices a partition
// it holds and never delivers.
type feed struct {
	topic      string
	subscriber *kafka.Subscriber
	watchdog   *inboxkafka.Watchdog
}

// newConsumer reads the service's topic in the service's consumer group,
// and its redrive topic in a group of that name.
func newConsumer(cfg Config, svc Service, ibx *inbox.Inbox, mtr *metrics, log *slog.Logger) (consumer, error) {
	wlog := newWatermillLogger(log)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, wlog)
	if err != nil {
		return consumer{}, err
	}
	var c consumer
	for _, f := range []struct{ group, topic, client string }{
		{svc.Name, svc.Topic, svc.Name + "-consumer-" + cfg.Instance},
		{kafkaconf.RedriveTopic(svc.Name), kafkaconf.RedriveTopic(svc.Name), svc.Name + "-redrive-" + cfg.Instance},
	} {
		fd, err := newFeed(cfg, f.group, f.topic, clientID(f.client), recordSkipped(ibx, log), mtr, log)
		if err != nil {
			c.close()
			return consumer{}, err
		}
		c.feeds = append(c.feeds, fd)
	}
	c.router = router
	return c, nil
}

func newFeed(cfg Config, group, topic, client string, onSkipped func(inbox.SkippedRange), mtr *metrics, log *slog.Logger) (feed, error) {
	conf := kafkaconf.Sarama()
	// Each replica's consumer names itself, so a group's description (and
	// the lag an operator reads) says which replica holds a partition.
	conf.ClientID = client
	conf.Consumer.Offsets.AutoCommit.Interval = cfg.KafkaCommitInterval
	conf.Consumer.Group.Session.Timeout = cfg.KafkaSessionTimeout
	conf.Consumer.Group.Heartbeat.Interval = cfg.KafkaSessionTimeout / 3
	conf.Consumer.Group.Rebalance.Timeout = cfg.KafkaRebalanceTimeout
	conf.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: cfg.KafkaBrokers, Unmarshaler: marshaler(), OverwriteSaramaConfig: conf,
		ConsumerGroup: group,
	}, newWatermillLogger(log))
	if err != nil {
		return feed{}, fmt.Errorf("creating kafka subscriber for %s: %w", topic, err)
	}
	// A partition this replica holds with records waiting and none of them
	// reaching the handler is a stall nothing else reports; records the
	// broker lost under the group, a skipped range nothing else sees.
	watchdog, err := inboxkafka.NewWatchdog(inboxkafka.WatchdogConfig{
		Brokers: cfg.KafkaBrokers, Sarama: kafkaconf.Sarama(), Group: group, Topic: topic, ClientID: client,
		Timeout: cfg.KafkaStallTimeout, Logger: log, OnRead: mtr.onGroupRead(group, topic), OnSkipped: onSkipped,
	})
	if err != nil {
		subscriber.Close()
		return feed{}, err
	}
	return feed{topic: topic, subscriber: subscriber, watchdog: watchdog}, nil
}

// recordSkipped is a feed's WatchdogConfig.OnSkipped: each range the
// broker lost under the group is recorded in the consumer's database
// (inbox_skipped_ranges; inboxctl skipped), counted by the metrics and
// logged once, by the inbox.
func recordSkipped(ibx *inbox.Inbox, log *slog.Logger) func(inbox.SkippedRange) {
	return func(r inbox.SkippedRange) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := ibx.RecordSkipped(ctx, r); err != nil {
			log.Error("could not record records the broker lost; the next reading tries again", "range", r.String(), "err", err)
		}
	}
}

// close closes the subscribers of a consumer that will not run.
func (c consumer) close() {
	for _, f := range c.feeds {
		f.subscriber.Close()
	}
}

// watchStalls runs a feed's stall watchdog until ctx ends. A stall
// ends the service: its goroutines are written to stderr (where the claim
// or the delivery waits), and Run returns the error, so the process exits
// and its supervisor starts it again with a new group session.
func watchStalls(ctx context.Context, w *inboxkafka.Watchdog, log *slog.Logger) error {
	err := w.Run(ctx)
	if errors.Is(err, inboxkafka.ErrStalled) {
		log.Error("consumer stalled: exiting so that a new process takes its partitions; its goroutines follow on stderr", "err", err)
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) //nolint:errcheck // best effort, on the way out
	}
	return err
}

// clientID is s with every character Kafka's client.id does not allow
// (A-Z a-z 0-9 . _ -) replaced by '_'.
func clientID(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, s)
}
