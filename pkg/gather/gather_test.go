package gather

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// callers puts perCaller items from each of n callers, each caller waiting
// for its item's batch before it puts the next, as a partition's deliveries
// or a client's requests do, and returns the batch sizes.
func callers(t *testing.T, q *Queue[chan struct{}], n, perCaller int) []int {
	t.Helper()
	var mu sync.Mutex
	var sizes []int
	go q.Run(func(batch []chan struct{}) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
		time.Sleep(time.Millisecond) // the batch's transaction
		for _, done := range batch {
			close(done)
		}
	})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perCaller {
				done := make(chan struct{})
				if !q.Put(context.Background(), done) {
					t.Error("Put gave up without a deadline") // not require: this is not the test's goroutine
					return
				}
				<-done
				q.Done()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return sizes
}

// TestLinger: with a linger, batches after the first few hold an item of
// every caller; without one, the callers split into halves that take turns.
func TestLinger(t *testing.T) {
	t.Parallel()
	const n, perCaller = 16, 20
	full := func(sizes []int) (k int) {
		for _, s := range sizes {
			if s == n {
				k++
			}
		}
		return k
	}

	with := callers(t, New[chan struct{}](64, 64, 200*time.Millisecond), n, perCaller)
	t.Logf("with a linger: %v", with)
	require.GreaterOrEqual(t, full(with), perCaller-2, "batches did not hold every caller: %v", with)

	without := callers(t, New[chan struct{}](64, 64, 0), n, perCaller)
	t.Logf("without: %v", without)
	require.Less(t, full(without), perCaller-2, "the halves met without a linger, so this test cannot tell: %v", without)
}

// TestPutGivesUp: a Put whose context ends while the queue is full returns
// false and leaves nothing counted in flight.
func TestPutGivesUp(t *testing.T) {
	t.Parallel()
	q := New[int](4, 1, 0)
	require.True(t, q.Put(context.Background(), 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.False(t, q.Put(ctx, 2))
	require.Equal(t, int64(1), q.inflight.Load())
	require.Equal(t, 1, q.Waiting())
}

// TestCloseRunsWhatWasPut: after Close, Run hands out every item put before
// it, in batches of those items only (a closed channel's zero values are no
// items), and returns; a waiting linger ends too.
func TestCloseRunsWhatWasPut(t *testing.T) {
	for _, linger := range []time.Duration{0, time.Hour} {
		q := New[*int](8, 8, linger)
		var got []*int
		items := []*int{new(int), new(int), new(int)}
		for _, it := range items {
			require.True(t, q.Put(context.Background(), it))
		}
		q.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			q.Run(func(batch []*int) { got = append(got, batch...) })
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("linger %v: Run did not return after Close", linger)
		}
		require.Equal(t, items, got, "linger %v: Run must hand out exactly the items put", linger)
	}
}
