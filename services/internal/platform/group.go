package platform

import (
	"context"
	"sync"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/gather"
)

// Group commits concurrent requests together, the producer-side twin of the
// inbox's batches: calls of Do that arrive while a batch is running wait for
// the next one, up to max per batch, and up to workers batches run at once.
// A batch is one call of run, which is meant to be one transaction with
// set-based statements, so a hundred concurrent payments cost a handful of
// statements and one WAL flush instead of a hundred of each. Each call
// returns only after its batch returned, so a request is never answered
// before its effects are committed.
//
// If run fails for a batch of several requests, each of them is run again
// alone, so a request that cannot succeed fails by itself.
type Group[In, Out any] struct {
	run     func(ctx context.Context, ins []In) ([]Out, error)
	max     int
	workers int
	linger  time.Duration
	timeout time.Duration

	once  sync.Once
	queue *gather.Queue[*groupCall[In, Out]]
}

type groupCall[In, Out any] struct {
	ctx  context.Context
	in   In
	out  Out
	err  error
	done chan struct{}
}

// NewGroup returns a Group that runs batches of up to size requests with run,
// workers at a time, each bounded by timeout. A batch that follows a batch
// of several may wait up to linger for the callers of the last one to come
// back with their next requests (pkg/gather); 0: it takes only those
// waiting. run returns one Out per In, in order. With size 1 every request
// runs alone.
func NewGroup[In, Out any](size, workers int, linger, timeout time.Duration, run func(ctx context.Context, ins []In) ([]Out, error)) *Group[In, Out] {
	return &Group[In, Out]{run: run, max: max(1, size), workers: max(1, workers), linger: linger, timeout: timeout}
}

// Do runs in in the next batch and returns its result.
func (g *Group[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	if g.max == 1 {
		out, err := g.runBatch(ctx, []In{in})
		if err != nil {
			var zero Out
			return zero, err
		}
		return out[0], nil
	}
	g.once.Do(func() {
		g.queue = gather.New[*groupCall[In, Out]](g.max, g.max*g.workers, g.linger)
		for range g.workers {
			go g.queue.Run(g.runCalls)
		}
	})
	c := &groupCall[In, Out]{ctx: ctx, in: in, done: make(chan struct{})}
	if !g.queue.Put(ctx, c) {
		var zero Out
		return zero, ctx.Err()
	}
	<-c.done // not ctx: once queued, the batch may commit it
	g.queue.Done()
	return c.out, c.err
}

// runCalls runs one batch of calls and answers each.
func (g *Group[In, Out]) runCalls(calls []*groupCall[In, Out]) {
	ins := make([]In, len(calls))
	for i, c := range calls {
		ins[i] = c.in
	}
	outs, err := g.runBatch(calls[0].ctx, ins)
	for i, c := range calls {
		switch {
		case err == nil:
			c.out = outs[i]
		case len(calls) == 1:
			c.err = err
		default:
			var one []Out
			if one, c.err = g.runBatch(c.ctx, ins[i:i+1]); c.err == nil {
				c.out = one[0]
			}
		}
		close(c.done)
	}
}

// runBatch runs one batch. It does not inherit the cancellation of the
// request that opened it (the others still want their answer), only its
// values, and is bounded by the group's timeout.
func (g *Group[In, Out]) runBatch(ctx context.Context, ins []In) ([]Out, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	defer cancel()
	return g.run(ctx, ins)
}
