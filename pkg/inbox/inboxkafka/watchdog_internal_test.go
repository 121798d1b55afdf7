package inboxkafka

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestWatchdogSeesWhatSaramaSkips: a delivery past the offset the
// partition's next should have had, over records the log start has passed,
// is a skipped range, even once the group's committed offset is past them
// (Sarama started the partition again at its log start, and committed what
// it delivered there); a gap the log still starts below (compaction) is
// not, and one noted while the group was being read waits for the next
// reading.
func TestWatchdogSeesWhatSaramaSkips(t *testing.T) {
	var got []inbox.SkippedRange
	w, err := NewWatchdog(WatchdogConfig{Brokers: []string{"unused"}, Sarama: sarama.NewConfig(), Group: "g", Topic: "t", ClientID: "c",
		OnSkipped: func(r inbox.SkippedRange) { got = append(got, r) }})
	require.NoError(t, err)
	truncations := map[int32]int64{}
	read := func(lags ...PartitionLag) {
		w.skipped(lags, time.Time{}, time.Now(), w.expect(lags), truncations)
	}

	read(PartitionLag{Partition: 1, Committed: 2, Start: 0, End: 2}) // the consumer starts at 2
	w.delivered(1, 2)
	w.delivered(1, 7) // 3 to 6 deleted meanwhile: Sarama went on at the log start
	read(PartitionLag{Partition: 1, Committed: 8, Start: 7, End: 8})
	require.Equal(t, []inbox.SkippedRange{{Topic: "t", Partition: 1, From: 3, To: 7, Cause: inbox.Deleted}}, got)

	got = nil
	w.delivered(1, 12) // 8 to 11 compacted away: the log starts below them
	read(PartitionLag{Partition: 1, Committed: 13, Start: 7, End: 13})
	require.Empty(t, got)

	readAt := time.Now()
	w.delivered(1, 20) // while the group was read: its start is from before
	lags := []PartitionLag{{Partition: 1, Committed: 13, Start: 7, End: 21}}
	w.skipped(lags, time.Time{}, readAt.Add(-time.Second), w.expect(lags), truncations)
	require.Empty(t, got)
	read(PartitionLag{Partition: 1, Committed: 21, Start: 20, End: 21})
	require.Equal(t, []inbox.SkippedRange{{Topic: "t", Partition: 1, From: 13, To: 20, Cause: inbox.Deleted}}, got)

	// The partition goes to another member, which reads on past records
	// retention then deletes; back here, its next delivery is no jump.
	got = nil
	read(PartitionLag{Partition: 1, Committed: 21, Start: 20, End: 40, Owner: "other"})
	w.delivered(1, 90)
	read(PartitionLag{Partition: 1, Committed: 91, Start: 60, End: 91})
	require.Empty(t, got, "a partition another member held, its offsets moved on")

	// A partition this member holds and never committed: its claim began at
	// the log start, and records deleted past it were never read.
	read(PartitionLag{Partition: 2, Committed: -1, Start: 0, End: 0, Owner: "c"})
	read(PartitionLag{Partition: 2, Committed: -1, Start: 2, End: 2, Owner: "c"})
	require.Equal(t, []inbox.SkippedRange{{Topic: "t", Partition: 2, From: 0, To: 2, Cause: inbox.Deleted}}, got)
}
