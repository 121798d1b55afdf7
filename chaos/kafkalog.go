package main

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
	"github.com/outboxref/outbox-inbox/testbed/system"
)

// kafkaRecord is one record a topic holds, as the harness's own client
// read it.
type kafkaRecord struct {
	topic     string
	partition int32
	offset    int64
	key       string // the record key: the message's partition key
	id        string // the message id (watermill's UUID header)
	payload   []byte
}

// readKafka reads everything the run's topics hold (the events', the dead
// letters' and the probe streams'). The cluster may still be electing
// leaders after the last fault: it tries for a minute before giving up on
// the run.
func (h *harness) readKafka(ctx context.Context) ([]kafkaRecord, error) {
	topics := append(append([]string(nil), system.Topics...), probeTopics()...)
	for try := 0; ; try++ {
		records, err := readTopics(ctx, h.sys.Kafka.DirectBrokers(), topics...)
		if err == nil || try == 12 {
			return records, err
		}
		h.say("reading Kafka: %v (trying again)", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// readTopics reads every partition of topics from its first to its last
// offset, in offset order.
func readTopics(ctx context.Context, brokers []string, topics ...string) ([]kafkaRecord, error) {
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
	var records []kafkaRecord
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

func readPartition(ctx context.Context, consumer sarama.Consumer, topic string, p int32, first, end int64, records []kafkaRecord) ([]kafkaRecord, error) {
	pc, err := consumer.ConsumePartition(topic, p, first)
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	for {
		select {
		case m := <-pc.Messages():
			r := kafkaRecord{topic: topic, partition: p, offset: m.Offset, key: string(m.Key), payload: m.Value}
			for _, hd := range m.Headers {
				if string(hd.Key) == kafka.UUIDHeaderKey {
					r.id = string(hd.Value)
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
func copiesByID(records []kafkaRecord) map[string]map[string]int {
	copies := map[string]map[string]int{}
	for _, r := range records {
		if copies[r.topic] == nil {
			copies[r.topic] = map[string]int{}
		}
		copies[r.topic][r.id]++
	}
	return copies
}
