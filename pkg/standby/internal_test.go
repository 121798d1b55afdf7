package standby

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// A promotion starts a new timeline: a wait marked on the old one fails,
// whether or not its target was read yet, and whatever the new primary's
// standbys hold.
func TestSettleFailsWaitsOfAnotherTimeline(t *testing.T) {
	g := &Gate{cfg: Config{Standbys: 1}}
	fresh := &waiter{Ticket: Ticket{timeline: 3}, target: -1, done: make(chan error, 1)}
	targeted := &waiter{Ticket: Ticket{timeline: 3}, target: 100, done: make(chan error, 1)}
	g.waiters = []*waiter{fresh, targeted}
	g.settle(slices.Clone(g.waiters), position{timeline: 4, insert: 500, flushed: []int64{500}})
	require.ErrorIs(t, <-fresh.done, ErrPrimaryChanged)
	require.ErrorIs(t, <-targeted.done, ErrPrimaryChanged)
	require.Empty(t, g.waiters)
	require.Equal(t, int64(2), g.stats.changed.Load())
}

// A wait's target is the first read's flush position; the standbys' flush
// must reach it.
func TestSettleTargetsTheFirstReadsInsertPosition(t *testing.T) {
	g := &Gate{cfg: Config{Standbys: 2}}
	w := &waiter{Ticket: Ticket{timeline: 1}, target: -1, done: make(chan error, 1)}
	g.waiters = []*waiter{w}
	g.settle(slices.Clone(g.waiters), position{timeline: 1, insert: 250, flush: 200, flushed: []int64{300, 150}})
	require.Equal(t, int64(200), w.target)
	require.Len(t, g.waiters, 1, "the second standby holds 150 < 200")
	g.settle(slices.Clone(g.waiters), position{timeline: 1, insert: 450, flush: 400, flushed: []int64{400, 200}})
	require.NoError(t, <-w.done)
	require.Empty(t, g.waiters)
}

func TestTimelineOf(t *testing.T) {
	tl, err := timelineOf("0000000A0000000100000002")
	require.NoError(t, err)
	require.Equal(t, uint32(10), tl)
	for _, bad := range []string{"", "0000", "00000000000000010000000A", "zzzzzzzz0000000100000002"} {
		_, err := timelineOf(bad)
		require.Error(t, err, bad)
	}
}

// A transaction committed with synchronous_commit off may return before its
// commit is flushed: its wait targets the insert position.
func TestSettleTargetsInsertWhenCommitsAreNotFlushed(t *testing.T) {
	g := &Gate{cfg: Config{Standbys: 1}}
	w := &waiter{Ticket: Ticket{timeline: 1, unflushed: true}, target: -1, done: make(chan error, 1)}
	g.waiters = []*waiter{w}
	g.settle(slices.Clone(g.waiters), position{timeline: 1, insert: 250, flush: 200, flushed: []int64{200}})
	require.Equal(t, int64(250), w.target)
	require.Len(t, g.waiters, 1)
}
