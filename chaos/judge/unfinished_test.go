package judge_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/services/events"
)

// TestClassifyMissing: a missing stage's event is "not finished" while it
// is on its way (unpublished, or in Kafka at or past its group's committed
// offset) and "lost" when nothing will bring it (never written, published
// and not in Kafka, or every copy behind the committed offset). A drain
// that times out with a stalled partition must read as the first; an
// offset committed past an unapplied event as the second.
func TestClassifyMissing(t *testing.T) {
	captured := func(order string, ids ...string) judge.MissingEvent {
		return judge.MissingEvent{MissingStage: judge.MissingStage{Order: order, Stage: judge.StageCaptured},
			Topic: events.TopicOrders, Group: "inventory", IDs: ids, Published: true}
	}
	records := []judge.Record{
		{Topic: events.TopicOrders, Partition: 3, Offset: 1500, ID: "waiting"},
		{Topic: events.TopicOrders, Partition: 3, Offset: 900, ID: "skipped"},
		{Topic: events.TopicOrders, Partition: 3, Offset: 800, ID: "copied"},  // a relay's repeat: one copy behind,
		{Topic: events.TopicOrders, Partition: 3, Offset: 1201, ID: "copied"}, // one still to come
		{Topic: events.TopicOrders, Partition: 1, Offset: 10, ID: "never-committed"},
	}
	lags := []judge.PartitionLag{
		{Group: "inventory", Topic: events.TopicOrders, Partition: 3, Committed: 1200, End: 2400, Owner: "inventory-consumer-inventory-2@127.0.0.1"},
		{Group: "inventory", Topic: events.TopicOrders, Partition: 1, Committed: -1, End: 11},
	}
	unpublished := captured("o-unpublished", "row")
	unpublished.Published = false

	for _, tc := range []struct {
		name                     string
		missing                  judge.MissingEvent
		notFinished, lost, field int
	}{
		{"stalled: in Kafka past the committed offset", captured("o1", "waiting"), 1, 0, 0},
		{"a repeat still to come", captured("o2", "copied"), 1, 0, 0},
		{"a group that never committed", captured("o3", "never-committed"), 1, 0, 0},
		{"not published yet", unpublished, 1, 0, 0},
		{"committed past it", captured("o4", "skipped"), 0, 1, 0},
		{"published, not in Kafka", captured("o5", "vanished"), 0, 1, 0},
		{"never written", captured("o6"), 0, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := judge.ClassifyMissing([]judge.MissingEvent{tc.missing}, records, lags)
			require.Equal(t, tc.notFinished, u.NotFinished(), u.String())
			require.Equal(t, tc.lost, u.Lost(), u.String())
			require.Contains(t, u.String(), "order "+tc.missing.Order+"'s OrderCaptured")
		})
	}

	all := judge.ClassifyMissing([]judge.MissingEvent{captured("o1", "waiting"), captured("o4", "skipped")}, records, lags)
	require.Equal(t, 1, all.InKafka)
	require.Equal(t, 1, all.PastCommit)
	require.Contains(t, all.String(), "inventory-consumer-inventory-2", "a stalled partition's owner is named")
}
