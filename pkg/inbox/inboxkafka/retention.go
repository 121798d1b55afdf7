package inboxkafka

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// Retention that knows Kafka. The inbox sweep deletes a row after
// inbox.Config.Retention; a message that arrives again after that is applied
// again. Kafka decides how late a message can arrive again: a consumer group
// whose committed offsets expired (offsets.retention.minutes after it last
// had members) starts over from the oldest record still kept, and a record
// is kept until its whole segment is older than retention.ms, so up to
// retention.ms + segment.ms after it was written (plus the broker's
// log.retention.check.interval.ms). CheckRetention reads those numbers from
// the cluster and refuses a Retention that does not cover them.

// TopicRetention is how long one topic keeps a record, as its configs say.
type TopicRetention struct {
	Topic     string
	Retention time.Duration // retention.ms; 0 with Forever
	Segment   time.Duration // segment.ms: how long a segment stays open at most
	Forever   bool          // retention.ms = -1: records are never deleted by age
	Source    string        // where the numbers come from: the topic's configs, or a broker's defaults
}

// Retention is what a cluster says about how late a message can be
// delivered again.
type Retention struct {
	Topics []TopicRetention
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
// true when a topic never deletes by age; then no Retention is safe.
func (k Retention) Horizon() (horizon time.Duration, topic TopicRetention, forever bool) {
	for _, t := range k.Topics {
		if t.Forever {
			return 0, t, true
		}
		if h := t.Retention + t.Segment + k.CheckInterval; h > horizon {
			horizon, topic = h, t
		}
	}
	return horizon, topic, false
}

// ErrRetentionTooShort is wrapped by CheckRetention's refusal.
var ErrRetentionTooShort = errors.New("inbox retention shorter than Kafka's")

// Check refuses retention (an inbox's Config.Retention) when Kafka can hand
// a message of k's topics to the consumer again after the sweep removed its
// inbox row. The error names both numbers and the topic.
func (k Retention) Check(retention time.Duration) error {
	horizon, topic, forever := k.Horizon()
	switch {
	case forever:
		return fmt.Errorf("%w: topic %q (%s) keeps records forever (retention.ms=-1), so a group whose offsets expire "+
			"(offsets.retention.minutes=%d) replays all of it, but the inbox forgets a message after Config.Retention=%s: "+
			"give the topic a retention.ms, or do not sweep", ErrRetentionTooShort, topic.Topic, topic.Source,
			int(k.OffsetsRetention.Minutes()), retention)
	case retention < horizon:
		return fmt.Errorf("%w: topic %q (%s) can hand a message out again for up to %s (retention.ms + segment.ms + the broker's check interval; "+
			"a group whose offsets expire after offsets.retention.minutes=%d replays from the oldest record), "+
			"but the inbox forgets a message after Config.Retention=%s: raise Retention to at least %s, or lower the topic's retention.ms or segment.ms",
			ErrRetentionTooShort, topic.Topic, topic.Source, horizon, int(k.OffsetsRetention.Minutes()), retention, horizon)
	}
	return nil
}

// ReadRetention reads, through the Kafka admin API (DescribeConfigs),
// the retention of topics and the brokers' offset retention. A topic that
// does not exist yet gets the brokers' defaults for new topics
// (log.retention.*, log.roll.*), which it will have when a consumer's
// subscription creates it.
func ReadRetention(admin sarama.ClusterAdmin, topics ...string) (Retention, error) {
	var k Retention
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return k, fmt.Errorf("inboxkafka: describing the Kafka cluster: %w", err)
	}
	if len(brokers) == 0 {
		return k, errors.New("inboxkafka: the Kafka cluster listed no brokers")
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
		t := TopicRetention{Topic: topic, Retention: ms, Forever: ms < 0, Source: source}
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
		return nil, fmt.Errorf("inboxkafka: reading Kafka configs of %s: %w", name, err)
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
	return 0, fmt.Errorf("inboxkafka: Kafka did not report %s.ms, .minutes or .hours of %s", key, of)
}

func number(cfg map[string]string, key, of string) (int64, error) {
	raw, ok := cfg[key]
	if !ok {
		return 0, fmt.Errorf("inboxkafka: Kafka did not report %s of %s", key, of)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("inboxkafka: %s of %s is %q, not a number", key, of, raw)
	}
	return n, nil
}

// CheckRetention reads the retention of topics (those an inbox's consumer
// reads) through admin, and refuses (ErrRetentionTooShort) a retention (the
// inbox's Config.Retention) that Kafka can outlast. Call it at start-up,
// before consuming.
func CheckRetention(admin sarama.ClusterAdmin, retention time.Duration, topics ...string) (Retention, error) {
	k, err := ReadRetention(admin, topics...)
	if err != nil {
		return k, err
	}
	return k, k.Check(retention)
}
