// Package outboxkafka is the outbox relay's way into Kafka through Sarama: a
// publisher that sends a relay batch as one produce round trip, and the
// classification of Sarama's errors that tells the relay which rows Kafka
// will never take (so it parks them instead of retrying forever).
//
// It is a package of its own so that pkg/outbox stays broker-agnostic: a
// program that relays to another broker never links Sarama.
package outboxkafka

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// FlushWindow is how long the Publisher's producer gathers the messages of
// a Publish call into one produce request per partition leader
// (Producer.Flush.Frequency), unless the Sarama config sets a Flush
// threshold of its own. Measured on Apache Kafka at 250 orders/s in the
// benchmark (docs/benchmark.md): the hop's p99 140.8/122.7/134.3 →
// 70.5/93.9/83.1 ms in three pairs.
const FlushWindow = time.Millisecond

// Publisher is the relay's publisher for Kafka: it sends all messages of one
// Publish call as one batch (Sarama's SendMessages: one produce request per
// partition leader, not one round trip per message) and returns only when
// the broker acknowledged every one of them. A refusal Kafka will repeat for
// a message of the batch (IsPermanent) comes back wrapped in
// [outbox.Permanent], so the relay's default RelayConfig.IsPermanent finds
// and parks that message.
//
// Sarama may still send a batch's messages of one partition in more than
// one produce request (a batch it gathers past FlushWindow, a retry), and a
// refusal of one record does not stop the
// records after it: had the broker refused a record for its size, a later
// message of the same key in the same batch could be written before it, and
// the relay's promise (a parked row holds back its key) would be broken
// before the relay could park anything. So Publish first checks every
// message against its topic's max.message.bytes (read through the admin API,
// kept for TopicLimitTTL) and refuses the whole batch, sending nothing, when
// one does not fit; the relay then finds and parks that one. The check counts
// a record's largest possible overhead, uncompressed, so a message within
// ~40 bytes of the limit, or one that compression would bring under it, is
// refused though Kafka might have taken it. What it cannot see: a
// batch of messages that each fit but together exceed a topic limit lowered
// below Producer.MaxMessageBytes (keep Producer.MaxMessageBytes at or under
// your topics' max.message.bytes), a limit changed within the TTL, and any
// topic whose configs cannot be read (then nothing is checked, and
// Config.Logger says so).
//
// watermill-kafka's own Publisher sends messages one at a time, waiting for
// each acknowledgement; both satisfy message.Publisher, and the relay works
// with either (give it IsPermanent as RelayConfig.IsPermanent then). The
// benchmark in bench/ measures the difference.
type Publisher struct {
	producer  sarama.SyncProducer
	admin     sarama.ClusterAdmin
	marshaler kafka.Marshaler
	logger    watermill.LoggerAdapter

	mu     sync.Mutex
	limits map[string]topicLimit
}

// TopicLimitTTL is how long a Publisher trusts a topic's max.message.bytes
// before it reads it again.
const TopicLimitTTL = time.Minute

// recordBatchOverhead is a record batch's header (message format v2): what
// one record costs in a batch besides its own bytes, which is what the
// broker holds against max.message.bytes.
const recordBatchOverhead = 61

type topicLimit struct {
	bytes int // 0: unknown, nothing checked
	read  time.Time
}

// Config configures a Publisher, in the style of the library's other
// components (outbox.RelayConfig, inbox.Config, effect.Config).
type Config struct {
	// Brokers to bootstrap from. Required.
	Brokers []string
	// Sarama is copied, not changed: the copy returns successes and errors
	// (the relay needs every acknowledgement) and keeps one in-flight
	// request per broker connection, so that a retried request cannot put
	// one key's messages out of order. Nil: sarama.NewConfig().
	Sarama *sarama.Config
	// Marshaler turns messages into records; usually
	// kafka.NewWithPartitioningMarshaler(outbox.PartitionKey), so one key's
	// messages share a partition. Required.
	Marshaler kafka.Marshaler
	// Logger receives what the publisher cannot do: read a topic's
	// max.message.bytes (the size check is then off for that topic until
	// the next read); and, at Info, a send still waiting for Kafka after
	// SlowSendAfter. Defaults to discarding it.
	Logger *slog.Logger
}

// New connects a batching publisher.
func New(cfg Config) (*Publisher, error) {
	var log watermill.LoggerAdapter = watermill.NopLogger{}
	if cfg.Logger != nil {
		log = watermill.NewSlogLogger(cfg.Logger)
	}
	return newPublisher(cfg.Brokers, cfg.Sarama, cfg.Marshaler, log)
}

func newPublisher(brokers []string, conf *sarama.Config, marshaler kafka.Marshaler, log watermill.LoggerAdapter) (*Publisher, error) {
	if marshaler == nil {
		return nil, errors.New("outboxkafka: Config.Marshaler is required")
	}
	if conf == nil {
		conf = sarama.NewConfig()
	}
	c := *conf
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Net.MaxOpenRequests = 1
	// Sarama sends what it holds as soon as it can: a batch's first
	// message alone, and, that request being the one in flight, the rest
	// in a second when it returns. Two round trips to the broker a batch,
	// and twice its requests. FlushWindow gathers a batch into one request
	// per leader, at the cost of that wait. A caller's own Flush settings
	// are kept.
	if c.Producer.Flush.Frequency == 0 && c.Producer.Flush.Bytes == 0 && c.Producer.Flush.Messages == 0 {
		c.Producer.Flush.Frequency = FlushWindow
	}
	// Sarama counts retries per message, and a message buffered behind a
	// failing request is counted a retry for each failure it waited
	// through as well, but from a later start: when the connection keeps
	// being reset, the first message of a key runs out of retries while the
	// ones behind it still have some, and those are sent and taken once the
	// broker answers again. Kafka would then hold the key's second message
	// before its first, and the relay's retry of the batch could not put the
	// first back in front (TestKeyOrderThroughFailedRequests; Sarama issue
	// 2619). So a transient failure is retried until Kafka takes the batch
	// or refuses it for good (a record too large, a topic that cannot be),
	// SendRetries times with a backoff doubling to 2s: at least half an
	// hour of outage, longer where each try also waits out a connection
	// timeout. A send waits out an outage instead of giving up on part of
	// a key, and so do the relay's Run and this Publisher's Close (a
	// graceful shutdown during an outage waits too; a process killed
	// meanwhile loses nothing). A relay whose send outlasts its batch loses
	// its session and with it its rows (RelayConfig.BatchTimeout): the
	// shard's next owner sends them again, in order, and what the stuck
	// send delivers later is a repeat.
	c.Producer.Retry.Max = SendRetries
	c.Producer.Retry.BackoffFunc = retryBackoff(cmp.Or(c.Producer.Retry.Backoff, 100*time.Millisecond))
	client, err := sarama.NewClient(brokers, &c)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: connecting: %w", err)
	}
	producer, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		client.Close() //nolint:errcheck // the error above is the one to report
		return nil, fmt.Errorf("outboxkafka: creating the producer: %w", err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		producer.Close() //nolint:errcheck // as above
		client.Close()   //nolint:errcheck
		return nil, fmt.Errorf("outboxkafka: creating the admin client: %w", err)
	}
	return &Publisher{producer: producer, admin: admin, marshaler: marshaler, logger: log, limits: map[string]topicLimit{}}, nil
}

// retryBackoff doubles first at each retry of a message, up to maxBackoff.
func retryBackoff(first time.Duration) func(retries, maxRetries int) time.Duration {
	return func(retries, _ int) time.Duration {
		return min(first<<min(retries, 8), max(first, maxBackoff))
	}
}

// maxBackoff is the longest wait between two tries of a message.
const maxBackoff = 2 * time.Second

// SendRetries is how often a message is tried again before a send gives
// up on it: with maxBackoff, at least 33 minutes. (Sarama keeps a slot
// per retry and partition, so it cannot be unbounded.)
const SendRetries = 1000

// SlowSendAfter is how long a send may wait for Kafka before the publisher
// says so in its log (it goes on waiting: see New).
const SlowSendAfter = 10 * time.Second

// Publish sends msgs to topic as one batch.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	batch := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		km, err := p.marshaler.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("outboxkafka: marshaling message %s: %w", msg.UUID, err)
		}
		batch[i] = km
	}
	if limit := p.topicLimit(topic); limit > 0 {
		for i, km := range batch {
			if n := km.ByteSize(2) + recordBatchOverhead; n > limit {
				return outbox.Permanent(fmt.Errorf("outboxkafka: message %s is too large for topic %s: up to %d bytes as a record batch, over its max.message.bytes %d (nothing of the batch was sent)",
					msgs[i].UUID, topic, n, limit))
			}
		}
	}
	slow := time.AfterFunc(SlowSendAfter, func() {
		p.logger.Info("Outbox publisher: Kafka has not taken the batch yet; its messages are retried until it does (a broker down, a leader moving, the network?)",
			watermill.LogFields{"topic": topic, "messages": len(batch), "waiting": SlowSendAfter.String()})
	})
	err := p.producer.SendMessages(batch)
	slow.Stop()
	if err != nil {
		var refused sarama.ProducerErrors // its text gives a count, not the reason: name the first
		if errors.As(err, &refused) && len(refused) > 0 && refused[0] != nil {
			err = fmt.Errorf("%w (the first for: %w)", err, refused[0].Err)
		}
		err = fmt.Errorf("outboxkafka: producing %d messages to %s: %w", len(batch), topic, err)
		if IsPermanent(err) {
			return outbox.Permanent(err)
		}
		return err
	}
	return nil
}

// topicLimit returns topic's max.message.bytes, 0 when it cannot be read
// (a topic not created yet: the broker's default applies, at least the
// producer's own default limit).
func (p *Publisher) topicLimit(topic string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.limits[topic]; ok && time.Since(l.read) < TopicLimitTTL {
		return l.bytes
	}
	l := topicLimit{read: time.Now()}
	entries, err := p.admin.DescribeConfig(sarama.ConfigResource{
		Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"max.message.bytes"},
	})
	for _, e := range entries {
		if e.Name == "max.message.bytes" {
			l.bytes, _ = strconv.Atoi(e.Value)
		}
	}
	var unknown *sarama.DescribeConfigError
	switch {
	case errors.As(err, &unknown) && unknown.Err == sarama.ErrUnknownTopicOrPartition:
		// Not created yet: the broker's default will apply, at least the
		// producer's own default limit; the relay's MaxMessageBytes holds.
	case err != nil || l.bytes == 0:
		p.logger.Error("Outbox publisher cannot read the topic's max.message.bytes; its size check is off until the next read",
			fmt.Errorf("%v (read %d)", err, l.bytes), watermill.LogFields{"topic": topic, "retry_in": TopicLimitTTL.String()})
	}
	p.limits[topic] = l
	return l.bytes
}

// Close closes the producer and its client.
func (p *Publisher) Close() error {
	err := p.producer.Close()
	if aerr := p.admin.Close(); err == nil { // closes the client too
		err = aerr
	}
	return err
}

// IsPermanent reports whether err, from this package's Publisher or from
// watermill-kafka's, says Kafka will never take a message of the batch: an
// error wrapped by outbox.Permanent, or the broker's refusals of a record:
// message too large (over the topic's max.message.bytes), record list too
// large, invalid record, invalid topic. Everything else (a broker down, a
// timeout, a leader moving) is transient, and the relay retries the batch
// after a backoff. (A message over Sarama's own Producer.MaxMessageBytes is
// refused by Sarama with a ConfigurationError, transient here: the relay's
// MaxMessageBytes, kept equal to it, parks such a row before any send.)
// Give it to the relay as RelayConfig.IsPermanent when the relay publishes
// through watermill-kafka's Publisher.
func IsPermanent(err error) bool {
	if outbox.IsPermanent(err) {
		return true
	}
	var batch sarama.ProducerErrors // SendMessages's, one per message
	if errors.As(err, &batch) {
		for _, pe := range batch {
			if pe != nil && IsPermanent(pe.Err) {
				return true
			}
		}
		return false
	}
	for _, kerr := range []sarama.KError{
		sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge,
		sarama.ErrInvalidRecord, sarama.ErrInvalidTopic,
	} {
		if errors.Is(err, kerr) {
			return true
		}
	}
	return false
}
