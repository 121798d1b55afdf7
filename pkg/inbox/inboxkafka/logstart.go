package inboxkafka

import (
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// Position is an inbox.Config.Position for messages a watermill-kafka
// Subscriber delivered: it reads the partition and offset the subscriber
// put in the message's context.
func Position(msg *message.Message) (partition int32, offset int64, ok bool) {
	p, ok := kafka.MessagePartitionFromCtx(msg.Context())
	if !ok {
		return 0, 0, false
	}
	o, ok := kafka.MessagePartitionOffsetFromCtx(msg.Context())
	return p, o, ok
}

// ReadLogStart reads the log-start offset of every partition of topics, for
// inbox.Config.LogStart.
func ReadLogStart(client sarama.Client, topics ...string) (inbox.LogStart, error) {
	out := inbox.LogStart{}
	for _, topic := range topics {
		if err := client.RefreshMetadata(topic); err != nil {
			return nil, fmt.Errorf("inboxkafka: reading %s's partitions: %w", topic, err)
		}
		parts, err := client.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("inboxkafka: reading %s's partitions: %w", topic, err)
		}
		out[topic] = map[int32]int64{}
		for _, p := range parts {
			start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				return nil, fmt.Errorf("inboxkafka: reading %s/%d's log start: %w", topic, p, err)
			}
			out[topic][p] = start
		}
	}
	return out, nil
}

// Key is an inbox.Config.Key for messages a watermill-kafka Subscriber
// delivered: the Kafka record's key, which decides its partition. The
// inbox's default reads the outbox's partition_key metadata instead, which
// is the same key for messages the outbox's relay published.
func Key(msg *message.Message) string {
	k, _ := kafka.MessageKeyFromCtx(msg.Context())
	return string(k)
}

// Verify returns an inbox.Config.Verify that checks each watermill-kafka
// delivery's signature with v, over the topic it was read from and its Kafka
// record's key (not a header, which a writer could set to anything).
func Verify(v *signature.Verifier) func(*message.Message) error {
	return func(msg *message.Message) error {
		return v.Verify(message.SubscribeTopicFromCtx(msg.Context()), Key(msg), msg)
	}
}
