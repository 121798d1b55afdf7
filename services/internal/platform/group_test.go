package platform

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGroup runs many concurrent requests through a Group: they share
// batches, each gets its own result, and a request that fails its batch
// fails alone while its companions succeed.
func TestGroup(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sizes []int
	var g *Group[int, string]
	var first sync.Once
	g = NewGroup(16, 1, 0, time.Second, func(_ context.Context, ins []int) ([]string, error) {
		first.Do(func() { // hold the first batch until others queue up behind it
			for deadline := time.Now().Add(2 * time.Second); g.queue.Waiting() < 16 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		})
		mu.Lock()
		sizes = append(sizes, len(ins))
		mu.Unlock()
		out := make([]string, len(ins))
		for i, n := range ins {
			if n == 13 {
				return nil, errors.New("13 is unlucky")
			}
			out[i] = fmt.Sprint("r", n)
		}
		return out, nil
	})

	var wg sync.WaitGroup
	results := make([]string, 64)
	errs := make([]error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = g.Do(context.Background(), i)
		}()
	}
	wg.Wait()
	for i := range 64 {
		if i == 13 {
			require.EqualError(t, errs[i], "13 is unlucky")
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, fmt.Sprint("r", i), results[i])
	}
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, slices.Max(sizes), 1, "no two requests shared a batch: %v", sizes)
	require.Contains(t, sizes, 1, "the failed batch's requests were not run alone")
}

// TestGroupOfOne runs every request alone, in the caller's goroutine.
func TestGroupOfOne(t *testing.T) {
	t.Parallel()
	calls := 0
	g := NewGroup(1, 1, 0, time.Second, func(_ context.Context, ins []int) ([]int, error) {
		calls++
		require.Len(t, ins, 1)
		return []int{ins[0] * 2}, nil
	})
	for i := range 3 {
		out, err := g.Do(context.Background(), i)
		require.NoError(t, err)
		require.Equal(t, i*2, out)
	}
	require.Equal(t, 3, calls)
}
