package judge

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// Record is one record a topic holds, as the judge's own Kafka client
// read it: no service's code stands between the log and the verdicts.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string // the record key: the message's partition key
	ID        string // the message id (watermill's UUID header)
	Payload   []byte
	// Hostile is the class of a hostile message the chaos driver wrote
	// itself (its HostileHeader), judged by the hostile table; "" for the
	// rest.
	Hostile string
}

// HostileHeader marks each hostile message the chaos driver writes, with
// its class: it is keyed as its producer would key it (its order id), so
// only the header tells it from the producer's own. No service reads it.
const HostileHeader = "chaos_hostile"

// ReadTopics reads every partition of topics from its first to its last
// offset, in offset order.
func ReadTopics(ctx context.Context, brokers []string, topics ...string) ([]Record, error) {
	client, err := sarama.NewClient(brokers, kafkaconf.Sarama())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	var records []Record
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", topic, err)
		}
		for _, p := range parts {
			first, err := client.GetOffset(topic, p, sarama.OffsetOldest)
			if err != nil {
				return nil, err
			}
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return nil, err
			}
			if end <= first {
				continue
			}
			if records, err = readPartition(ctx, consumer, topic, p, first, end, records); err != nil {
				return nil, err
			}
		}
	}
	return records, nil
}

func readPartition(ctx context.Context, consumer sarama.Consumer, topic string, p int32, first, end int64, records []Record) ([]Record, error) {
	pc, err := consumer.ConsumePartition(topic, p, first)
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	for {
		select {
		case m := <-pc.Messages():
			r := Record{Topic: topic, Partition: p, Offset: m.Offset, Key: string(m.Key), Payload: m.Value}
			for _, hd := range m.Headers {
				switch string(hd.Key) {
				case kafka.UUIDHeaderKey:
					r.ID = string(hd.Value)
				case HostileHeader:
					r.Hostile = string(hd.Value)
				}
			}
			records = append(records, r)
			if m.Offset >= end-1 {
				return records, nil
			}
		case err := <-pc.Errors():
			return nil, fmt.Errorf("%s/%d: %w", topic, p, err)
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("%s/%d: nothing read for 30s before offset %d", topic, p, end)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// copiesByID counts the records of each message id, per topic.
func copiesByID(records []Record) map[string]map[string]int {
	copies := map[string]map[string]int{}
	for _, r := range records {
		if copies[r.Topic] == nil {
			copies[r.Topic] = map[string]int{}
		}
		copies[r.Topic][r.ID]++
	}
	return copies
}
