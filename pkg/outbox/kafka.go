package outbox

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// KafkaPublisher is the relay's publisher for Kafka: it sends all messages
// of one Publish call as one batch (Sarama's SendMessages: one produce
// request per partition leader, not one round trip per message) and returns
// only when the broker acknowledged every one of them.
//
// watermill-kafka's own Publisher sends messages one at a time, waiting for
// each acknowledgement; both satisfy message.Publisher, and the relay works
// with either. The benchmark in bench/ measures the difference.
type KafkaPublisher struct {
	producer  sarama.SyncProducer
	marshaler kafka.Marshaler
}

// NewKafkaPublisher connects a batching publisher. marshaler is usually
// kafka.NewWithPartitioningMarshaler(PartitionKey). conf must have
// Producer.Return.Successes set; to keep one key's messages in order across
// retries, it is given at most one in-flight request per broker connection.
func NewKafkaPublisher(brokers []string, conf *sarama.Config, marshaler kafka.Marshaler) (*KafkaPublisher, error) {
	if marshaler == nil {
		return nil, errors.New("outbox: NewKafkaPublisher needs a marshaler")
	}
	conf.Producer.Return.Successes = true
	conf.Producer.Return.Errors = true
	conf.Net.MaxOpenRequests = 1
	producer, err := sarama.NewSyncProducer(brokers, conf)
	if err != nil {
		return nil, fmt.Errorf("outbox: creating kafka producer: %w", err)
	}
	return &KafkaPublisher{producer: producer, marshaler: marshaler}, nil
}

// Publish sends msgs to topic as one batch.
func (p *KafkaPublisher) Publish(topic string, msgs ...*message.Message) error {
	batch := make([]*sarama.ProducerMessage, len(msgs))
	for i, msg := range msgs {
		km, err := p.marshaler.Marshal(topic, msg)
		if err != nil {
			return fmt.Errorf("outbox: marshaling message %s: %w", msg.UUID, err)
		}
		batch[i] = km
	}
	if err := p.producer.SendMessages(batch); err != nil {
		return fmt.Errorf("outbox: producing %d messages to %s: %w", len(batch), topic, err)
	}
	return nil
}

// Close closes the producer.
func (p *KafkaPublisher) Close() error { return p.producer.Close() }
