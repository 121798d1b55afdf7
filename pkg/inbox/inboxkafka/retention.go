package inboxkafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/pkg/internal/kafkaretention"
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
type TopicRetention = kafkaretention.Topic

// Retention is what a cluster says about how late a message can be
// delivered again: its topics' retention, the brokers' offsets.retention.minutes
// (after a group has had no members for this long, its offsets are deleted
// and it starts again from the oldest record, Sarama's OffsetOldest) and
// log.retention.check.interval.ms; Horizon, the longest time after a record
// was written that Kafka may still hand it to a consumer.
type Retention struct{ kafkaretention.Retention }

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
	k, err := kafkaretention.Read(admin, topics...)
	return Retention{k}, err
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
