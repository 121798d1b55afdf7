// Package kafkaretention reads from a Kafka cluster how long it keeps a
// topic's records (DescribeConfigs): the inbox checks that it remembers a
// message as long as Kafka can hand it out again (inboxkafka), the outbox
// that it keeps a published row as long as Kafka can lose it
// (outboxkafka).
package kafkaretention

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Topic is how long one topic keeps a record, as its configs say.
type Topic struct {
	Topic     string
	Retention time.Duration // retention.ms; 0 with Forever
	Segment   time.Duration // segment.ms: how long a segment stays open at most
	Forever   bool          // retention.ms = -1: records are never deleted by age
	Source    string        // where the numbers come from: the topic's configs, or a broker's defaults
}

// Retention is what a cluster says about how late a message can be
// delivered again.
type Retention struct {
	Topics []Topic
	// OffsetsRetention is the brokers' offsets.retention.minutes: after a
	// group has had no members for this long, its offsets are deleted and
	// it starts again from the oldest record (Sarama's OffsetOldest).
	OffsetsRetention time.Duration
	// CheckInterval is log.retention.check.interval.ms: how often a broker
	// looks for segments to delete.
	CheckInterval time.Duration
}

// Horizon is the longest time after a record was written that Kafka may
// still hand it to a consumer: the longest retention.ms + segment.ms of the
// topics, plus the check interval, and the topic that sets it. forever is
// true when a topic never deletes by age (it stops at the first such
// topic): then Kafka may hand a record out again at any age.
func (k Retention) Horizon() (horizon time.Duration, topic Topic, forever bool) {
	for _, t := range k.Topics {
		if t.Forever {
			return 0, t, true
		}
		if h := k.Kept(t); h > horizon {
			horizon, topic = h, t
		}
	}
	return horizon, topic, false
}

// Kept is the longest a record of t (not Forever) stays in the log: its
// segment is deleted once the newest record in it is older than
// retention.ms, and a segment stays open up to segment.ms, found by a
// check every CheckInterval.
func (k Retention) Kept(t Topic) time.Duration {
	return t.Retention + t.Segment + k.CheckInterval
}

// Read reads, through the Kafka admin API (DescribeConfigs),
// the retention of topics and the brokers' offset retention. A topic that
// does not exist yet gets the brokers' defaults for new topics
// (log.retention.*, log.roll.*), which it will have when a consumer's
// subscription creates it.
func Read(admin sarama.ClusterAdmin, topics ...string) (Retention, error) {
	var k Retention
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return k, fmt.Errorf("kafka: describing the Kafka cluster: %w", err)
	}
	if len(brokers) == 0 {
		return k, errors.New("kafka: the Kafka cluster listed no brokers")
	}
	id := strconv.Itoa(int(brokers[0].ID()))
	broker, err := describe(admin, sarama.BrokerResource, id)
	if err != nil {
		return k, err
	}
	of := "broker " + id
	minutes, err := number(broker, "offsets.retention.minutes", of)
	if err != nil {
		return k, err
	}
	k.OffsetsRetention = time.Duration(minutes) * time.Minute
	k.CheckInterval = 5 * time.Minute // Kafka's default, when a broker does not say
	if ms, err := number(broker, "log.retention.check.interval.ms", of); err == nil {
		k.CheckInterval = time.Duration(ms) * time.Millisecond
	}

	for _, topic := range topics {
		retention, segment := "retention.ms", "segment.ms"
		of, source := "topic "+topic, "its configs"
		cfg, err := describe(admin, sarama.TopicResource, topic)
		var unknown *sarama.DescribeConfigError
		switch {
		case errors.As(err, &unknown) && unknown.Err == sarama.ErrUnknownTopicOrPartition:
			cfg, of = broker, "broker "+id
			source = "broker " + id + "'s defaults: the topic is not created yet"
			retention, segment = "log.retention", "log.roll"
		case err != nil:
			return k, err
		}
		ms, err := duration(cfg, retention, of)
		if err != nil {
			return k, err
		}
		t := Topic{Topic: topic, Retention: ms, Forever: ms < 0, Source: source}
		if t.Forever {
			t.Retention = 0
		}
		if t.Segment, err = duration(cfg, segment, of); err != nil {
			return k, err
		}
		k.Topics = append(k.Topics, t)
	}
	return k, nil
}

func describe(admin sarama.ClusterAdmin, typ sarama.ConfigResourceType, name string) (map[string]string, error) {
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: typ, Name: name})
	if err != nil {
		return nil, fmt.Errorf("kafka: reading Kafka configs of %s: %w", name, err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.Value != "" { // a null value: another key says it (log.retention.ms → .hours)
			out[e.Name] = e.Value
		}
	}
	return out, nil
}

// duration reads key as milliseconds; for a broker's log.retention and
// log.roll, the first of .ms, .minutes, .hours that is set.
func duration(cfg map[string]string, key, of string) (time.Duration, error) {
	if strings.HasSuffix(key, ".ms") {
		ms, err := number(cfg, key, of)
		return time.Duration(ms) * time.Millisecond, err
	}
	for _, unit := range []struct {
		suffix string
		d      time.Duration
	}{{".ms", time.Millisecond}, {".minutes", time.Minute}, {".hours", time.Hour}} {
		if _, ok := cfg[key+unit.suffix]; ok {
			n, err := number(cfg, key+unit.suffix, of)
			if n < 0 {
				return -1, err
			}
			return time.Duration(n) * unit.d, err
		}
	}
	return 0, fmt.Errorf("kafka: Kafka did not report %s.ms, .minutes or .hours of %s", key, of)
}

func number(cfg map[string]string, key, of string) (int64, error) {
	raw, ok := cfg[key]
	if !ok {
		return 0, fmt.Errorf("kafka: Kafka did not report %s of %s", key, of)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kafka: %s of %s is %q, not a number", key, of, raw)
	}
	return n, nil
}
