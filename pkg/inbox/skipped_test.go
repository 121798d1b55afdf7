package inbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
)

// TestRecordSkipped: a range the broker lost is recorded once, extended when
// the log start moves on, listed and counted; a range without a topic, an
// empty one, or one of no known cause is refused.
func TestRecordSkipped(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	adm := inboxadmin.New(b.pool)
	r := inbox.SkippedRange{Topic: "orders.events", Partition: 3, From: 105, To: 147, Cause: inbox.Deleted}
	for i, want := range []bool{true, false} {
		recorded, err := in.RecordSkipped(b.ctx, r)
		require.NoError(t, err)
		require.Equal(t, want, recorded, "time %d", i+1)
	}
	r.To = 160
	recorded, err := in.RecordSkipped(b.ctx, r)
	require.NoError(t, err)
	require.True(t, recorded, "extended")
	r.To = 150
	recorded, err = in.RecordSkipped(b.ctx, r)
	require.NoError(t, err)
	require.False(t, recorded, "a shorter reading of the same range")
	r.From, r.To = 100, 106 // seen from a committed offset a little lower: widened
	recorded, err = in.RecordSkipped(b.ctx, r)
	require.NoError(t, err)
	require.True(t, recorded, "widened down")
	_, err = in.RecordSkipped(b.ctx, inbox.SkippedRange{Topic: "orders.events", Partition: 0, From: 7, To: 9, Cause: inbox.Truncated})
	require.NoError(t, err)

	counts, err := adm.Skipped(b.ctx, in.Consumer())
	require.NoError(t, err)
	require.Equal(t, inboxadmin.SkippedCounts{Ranges: 2, Records: 60 + 2, Unrepaired: 2}, counts)
	list, err := adm.ListSkipped(b.ctx, in.Consumer(), 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, inbox.SkippedRange{Topic: "orders.events", Partition: 3, From: 100, To: 160, Cause: inbox.Deleted}, list[1].SkippedRange)
	require.Nil(t, list[1].RepairedAt)

	for _, bad := range []inbox.SkippedRange{
		{Partition: 1, From: 1, To: 2, Cause: inbox.Deleted},
		{Topic: "t", From: 5, To: 5, Cause: inbox.Deleted},
		{Topic: "t", From: 5, To: 6, Cause: "misplaced"},
	} {
		_, err := in.RecordSkipped(b.ctx, bad)
		require.Error(t, err, "%+v", bad)
	}
}
