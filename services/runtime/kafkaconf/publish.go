package kafkaconf

import (
	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// Publisher is a Watermill Kafka publisher that partitions by the outbox's
// key (outbox.PartitionKey), as the relays do: what the demo, a harness or
// a test uses to put a record on a topic beside the relays (a replay, a
// producer's bug, a forgery), landing on the partition the relay would
// choose. conf nil means Sarama().
func Publisher(brokers []string, conf *sarama.Config) (*kafka.Publisher, error) {
	if conf == nil {
		conf = Sarama()
	}
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey), OverwriteSaramaConfig: conf,
	}, watermill.NopLogger{})
}

// PublishOnce publishes msgs to topic with a Publisher of its own, closed
// before it returns, and returns the broker's answer.
func PublishOnce(brokers []string, conf *sarama.Config, topic string, msgs ...*message.Message) error {
	pub, err := Publisher(brokers, conf)
	if err != nil {
		return err
	}
	defer pub.Close() //nolint:errcheck // the send's error is the answer
	return pub.Publish(topic, msgs...)
}
