// Package gather turns calls that arrive together into batches: the inbox's
// batch transactions (pkg/inbox) use it, and so can a producer that commits
// concurrent requests in one transaction (the reference services' grouped
// API writes, services/internal/platform.Group, do).
//
// Callers Put an item and wait for its batch; workers Run batches of
// whatever is waiting. Each caller has at most one item in flight (a
// partition's delivery, a client's request), so under load a batch's callers
// come back with their next items just after it finishes, while the next
// batch, of the callers that queued meanwhile, runs: the callers split into
// two halves that take turns, each batch holding about half of them. A
// linger lets the halves meet: after a batch of more than one, the next one
// waits, up to the linger, for as many items as were in flight while the
// last one ran, and starts as soon as they are there.
package gather

import (
	"context"
	"sync/atomic"
	"time"
)

// Queue collects items into batches of up to max.
type Queue[T any] struct {
	ch     chan T
	max    int
	linger time.Duration
	// inflight counts the items between Put and Done; peak is the most
	// there were at once since a worker last reset it, as its batch started.
	inflight, peak atomic.Int64
}

// New returns a queue for batches of up to size items (at least 1), with
// room for depth waiting items, whose batches may wait up to linger (0:
// never).
func New[T any](size, depth int, linger time.Duration) *Queue[T] {
	return &Queue[T]{ch: make(chan T, depth), max: max(1, size), linger: linger}
}

// Put queues it for a batch, unless ctx ends first (false). A true Put must
// be followed by one Done, once the item's batch has finished with it.
func (q *Queue[T]) Put(ctx context.Context, it T) bool {
	n := q.inflight.Add(1)
	for p := q.peak.Load(); n > p && !q.peak.CompareAndSwap(p, n); p = q.peak.Load() {
	}
	select {
	case q.ch <- it:
		return true
	case <-ctx.Done():
		q.inflight.Add(-1)
		return false
	}
}

// Waiting returns how many items wait for a batch.
func (q *Queue[T]) Waiting() int { return len(q.ch) }

// Done counts an item out.
func (q *Queue[T]) Done() { q.inflight.Add(-1) }

// Close stops the queue: Put must not be called after it, and Run returns
// once it has run every item already put.
func (q *Queue[T]) Close() { close(q.ch) }

// Run calls fn with one batch at a time until the queue is closed and
// empty; run it on as many goroutines as batches may run at once.
func (q *Queue[T]) Run(fn func(batch []T)) {
	expect := 0 // items in flight during the last batch: what the next may wait for
	for first := range q.ch {
		batch := q.gather(first, expect)
		q.peak.Store(q.inflight.Load())
		fn(batch)
		expect = 0
		if len(batch) > 1 { // an idle queue never waits
			expect = int(q.peak.Load())
		}
	}
}

// gather returns first and the items waiting behind it, up to max. If fewer
// than expect are there, it waits up to the linger for the rest.
func (q *Queue[T]) gather(first T, expect int) []T {
	batch := []T{first}
	for len(batch) < q.max {
		select {
		case it, ok := <-q.ch:
			if !ok {
				return batch // closed and drained: a closed channel hands out zero values
			}
			batch = append(batch, it)
			continue
		default:
		}
		break
	}
	expect = min(expect, q.max)
	if len(batch) >= expect || q.linger <= 0 {
		return batch
	}
	timer := time.NewTimer(q.linger)
	defer timer.Stop()
	for len(batch) < expect {
		select {
		case it, ok := <-q.ch:
			if !ok {
				return batch
			}
			batch = append(batch, it)
		case <-timer.C:
			return batch
		}
	}
	return batch
}
