package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
)

// brokerFaults injects faults into the embedded broker through kfake's
// request hooks. Each fault is a one-shot control function: it intercepts
// the next request of its kind and is then removed.
type brokerFaults struct {
	cluster *kfake.Cluster // nil with an external broker: no faults
	rng     *rand.Rand

	mu    sync.Mutex // guards rng
	tally            // fault → requests it actually hit
}

// The broker faults.
const (
	faultCommitError   = "offset_commit_failed"  // the commit is refused: the offsets stay behind, more redeliveries
	faultCommitDelay   = "offset_commit_delayed" // the commit is held for 300ms
	faultProduceError  = "produce_failed"        // NOT_LEADER: the relay's batch fails or Sarama retries it
	faultDropConn      = "connection_dropped"    // the broker closes a client's connection mid-request
	faultProduceDelay  = "produce_delayed"       // the produce is held for 300ms
	faultFetchDropConn = "fetch_connection_dropped"
)

var faultKinds = []string{faultCommitError, faultCommitDelay, faultProduceError, faultDropConn, faultProduceDelay, faultFetchDropConn}

func newBrokerFaults(c *kfake.Cluster, seed uint64) *brokerFaults {
	return &brokerFaults{cluster: c, rng: rand.New(rand.NewPCG(seed, 0xfa17))}
}

// run arms one fault every mean interval (±50%) until ctx ends.
func (b *brokerFaults) run(ctx context.Context, mean time.Duration) {
	if b.cluster == nil {
		return
	}
	for {
		b.mu.Lock()
		wait := mean/2 + time.Duration(b.rng.Int64N(int64(mean)))
		kind := faultKinds[b.rng.IntN(len(faultKinds))]
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		b.arm(kind)
	}
}

var errDropped = errors.New("chaos: connection dropped")

func (b *brokerFaults) arm(kind string) {
	c := b.cluster
	sleep := func() { c.SleepControl(func() { time.Sleep(300 * time.Millisecond) }) }
	switch kind {
	case faultCommitError:
		c.ControlKey(kmsg.OffsetCommit.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
			b.add(kind)
			req := r.(*kmsg.OffsetCommitRequest)
			resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
			for _, t := range req.Topics {
				rt := kmsg.NewOffsetCommitResponseTopic()
				rt.Topic = t.Topic
				for _, p := range t.Partitions {
					rp := kmsg.NewOffsetCommitResponseTopicPartition()
					rp.Partition = p.Partition
					rp.ErrorCode = kerr.RequestTimedOut.Code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		})
	case faultProduceError:
		c.ControlKey(kmsg.Produce.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
			b.add(kind)
			return kafkatest.RefuseProduce(r.(*kmsg.ProduceRequest), kerr.NotLeaderForPartition.Code), nil, true
		})
	case faultCommitDelay, faultProduceDelay:
		key := kmsg.OffsetCommit.Int16()
		if kind == faultProduceDelay {
			key = kmsg.Produce.Int16()
		}
		c.ControlKey(key, func(kmsg.Request) (kmsg.Response, error, bool) {
			b.add(kind)
			c.DropControl() // one request only, then handled normally
			sleep()
			return nil, nil, false
		})
	case faultDropConn:
		c.ControlKey(kmsg.OffsetCommit.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			b.add(kind)
			return nil, errDropped, true
		})
	case faultFetchDropConn:
		c.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			b.add(kind)
			return nil, errDropped, true
		})
	}
}
