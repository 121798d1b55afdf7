package outboxkafka

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/pkg/internal/kafkaretention"
)

// ErrRetentionTooShort is wrapped by CheckRetention's refusal.
var ErrRetentionTooShort = errors.New("outbox retention shorter than Kafka's")

// CheckRetention reads how long Kafka keeps the records of topics (those
// the relay publishes to) and refuses (ErrRetentionTooShort) a retention
// (RelayConfig.Retention) shorter than that. The outbox is where a record
// Kafka lost can be sent again from (outboxadmin.Republish): a consumer that
// was down past retention.ms finds its records deleted, and only a row the
// relay still keeps can be published again. A record is kept until its
// whole segment is older than retention.ms, so up to retention.ms +
// segment.ms after it was written (plus the broker's check interval): the
// horizon returned, the longest of the topics', which retention must
// cover. A topic that keeps records forever (retention.ms=-1) loses none by
// age: forever is true and that topic sets no horizon, but what an
// operator or an unclean election deletes from it can be sent again only
// while its rows are kept. A topic that does not exist yet is read as the
// brokers' defaults for new topics. Call it at start-up.
func CheckRetention(admin sarama.ClusterAdmin, retention time.Duration, topics ...string) (horizon time.Duration, forever bool, err error) {
	k, err := kafkaretention.Read(admin, topics...)
	if err != nil {
		return 0, false, err
	}
	var topic kafkaretention.Topic
	for _, t := range k.Topics {
		if t.Forever {
			forever = true
		} else if h := k.Kept(t); h > horizon {
			horizon, topic = h, t
		}
	}
	if retention < horizon {
		return horizon, forever, fmt.Errorf("%w: topic %q (%s) keeps a record for up to %s (retention.ms + segment.ms + the broker's check interval), "+
			"but the relay deletes a published row after RelayConfig.Retention=%s: a record Kafka deletes under a consumer that was down "+
			"could no longer be sent again; raise Retention to at least %s, or lower the topic's retention.ms or segment.ms",
			ErrRetentionTooShort, topic.Topic, topic.Source, horizon, retention, horizon)
	}
	return horizon, forever, nil
}
