package judge

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// PartitionLag is where a consumer group stands on one partition, read by
// the judge's own Kafka client: what the group committed, what the log
// holds, and which member the group assigned it to.
type PartitionLag struct {
	Group     string
	Topic     string
	Partition int32
	Committed int64  // the group's committed offset (-1: none)
	End       int64  // the log end offset (high watermark)
	Owner     string // the assigned member's client id and host; "" when unassigned
}

// Lag is how many records the group has not committed past.
func (p PartitionLag) Lag() int64 {
	if p.Committed < 0 {
		return p.End
	}
	return p.End - p.Committed
}

func (p PartitionLag) String() string {
	owner := p.Owner
	if owner == "" {
		owner = "no member"
	}
	return fmt.Sprintf("%s %s/%d committed %d of %d (lag %d, %s)", p.Group, p.Topic, p.Partition, p.Committed, p.End, p.Lag(), owner)
}

// GroupLag reads, per partition of topic, what group committed against the
// log's end, and which member holds it.
func GroupLag(ctx context.Context, brokers []string, group, topic string) ([]PartitionLag, error) {
	client, err := sarama.NewClient(brokers, kafkaconf.Sarama())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return nil, err
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", topic, err)
	}
	committed, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", group, err)
	}
	owners := map[int32]string{}
	if desc, err := admin.DescribeConsumerGroups([]string{group}); err == nil {
		for _, d := range desc {
			for _, m := range d.Members {
				a, err := m.GetMemberAssignment()
				if err != nil || a == nil {
					continue
				}
				for _, p := range a.Topics[topic] {
					owners[p] = m.ClientId + "@" + strings.TrimPrefix(m.ClientHost, "/")
				}
			}
		}
	}
	var out []PartitionLag
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("%s/%d: %w", topic, p, err)
		}
		pl := PartitionLag{Group: group, Topic: topic, Partition: p, Committed: -1, End: end, Owner: owners[p]}
		if b := committed.GetBlock(topic, p); b != nil {
			pl.Committed = b.Offset
		}
		out = append(out, pl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out, nil
}
