package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/services/events"
)

// faultInjector is what the harness asks of broker faults, on kfake
// (faults.go: request hooks) or on Apache Kafka (apacheFaults: processes).
type faultInjector interface {
	run(ctx context.Context, mean time.Duration)
	counts() map[string]int
	total() int
}

// The faults done to a real cluster's JVMs, one at a time, so that at most
// one node of three is ever down and acks=all with min.insync.replicas=2
// can go on (but for the full restart, which takes every node down at once).
const (
	faultLeaderKilled      = "leader_killed"      // SIGKILL the leader of a random partition of a service topic
	faultCoordinatorKilled = "coordinator_killed" // SIGKILL the coordinator of a service's consumer group
	faultBrokerPaused      = "broker_paused"      // SIGSTOP a node past its broker session, then SIGCONT: a zombie wakes
	faultClusterRestarted  = "cluster_restarted"  // SIGKILL every node, then start them all on their data
	countLeaderChanges     = "leader_changes"     // a killed leader's partition led by another node afterwards
)

// apacheFaults kills, pauses and restarts the nodes of an Apache cluster.
type apacheFaults struct {
	c   *stack.ApacheCluster
	rng *rand.Rand
	say func(string, ...any)

	mu      sync.Mutex    // guards rng
	tally                 // faults by class, and leader_changes
	restart chan struct{} // a full-cluster restart requested by the harness
}

func newApacheFaults(c *stack.ApacheCluster, seed uint64, say func(string, ...any)) *apacheFaults {
	return &apacheFaults{c: c, rng: rand.New(rand.NewPCG(seed, 0xb40c)), say: say,
		restart: make(chan struct{}, 1)}
}

// total counts the faults done, not the leader changes they caused.
func (a *apacheFaults) total() int { return a.tally.total() - a.get(countLeaderChanges) }

// kills counts the broker SIGKILLs (a full restart kills every node).
func (a *apacheFaults) kills() int {
	c := a.counts()
	return c[faultLeaderKilled] + c[faultCoordinatorKilled] + c[faultClusterRestarted]*len(a.c.Nodes())
}

// restartCluster asks run for a full-cluster restart as its next fault.
func (a *apacheFaults) restartCluster() {
	select {
	case a.restart <- struct{}{}:
	default:
	}
}

// run does one fault every mean interval (±50%), each finished (the node
// back and the cluster ready) before the next, until ctx ends. Kills and
// pauses take turns, least done first.
func (a *apacheFaults) run(ctx context.Context, mean time.Duration) {
	for {
		a.mu.Lock()
		wait := mean/2 + time.Duration(a.rng.Int64N(int64(mean)))
		a.mu.Unlock()
		kind := faultLeaderKilled
		for _, k := range []string{faultCoordinatorKilled, faultBrokerPaused} {
			if a.get(k) < a.get(kind) {
				kind = k
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-a.restart:
			kind = faultClusterRestarted
		case <-time.After(wait):
		}
		if err := a.do(ctx, kind); err != nil && ctx.Err() == nil {
			a.say("broker fault %s: %v", kind, err)
		}
	}
}

func (a *apacheFaults) do(ctx context.Context, kind string) error {
	switch kind {
	case faultLeaderKilled:
		topics := []string{events.TopicOrders, events.TopicInventory}
		a.mu.Lock()
		topic, partition := topics[a.rng.IntN(len(topics))], int32(a.rng.IntN(stack.DefaultPartitions))
		a.mu.Unlock()
		leader, err := a.c.Leader(topic, partition)
		if err != nil {
			return err
		}
		return a.killAndRestart(ctx, kind, leader, fmt.Sprintf("leader of %s/%d", topic, partition), func() bool {
			now, err := a.c.Leader(topic, partition)
			return err == nil && now != leader
		})
	case faultCoordinatorKilled:
		groups := []string{"orders", "inventory"}
		a.mu.Lock()
		group := groups[a.rng.IntN(len(groups))]
		a.mu.Unlock()
		coord, err := a.c.Coordinator(group)
		if err != nil {
			return err
		}
		return a.killAndRestart(ctx, kind, coord, "coordinator of group "+group, func() bool {
			now, err := a.c.Coordinator(group)
			return err == nil && now != coord
		})
	case faultBrokerPaused:
		a.mu.Lock()
		n := a.c.Nodes()[a.rng.IntN(len(a.c.Nodes()))]
		pause := 5*time.Second + time.Duration(a.rng.Int64N(int64(3*time.Second)))
		a.mu.Unlock()
		if err := n.Pause(); err != nil {
			return err
		}
		a.say("broker fault: node %d paused (SIGSTOP) for %s, past its 3s broker session", n.ID, pause.Round(100*time.Millisecond))
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		if err := n.Resume(); err != nil {
			return err
		}
		a.add(kind)
		a.say("broker fault: node %d resumed (SIGCONT): a zombie broker wakes up", n.ID)
		return a.waitReady(ctx)
	case faultClusterRestarted:
		a.say("broker fault: full-cluster restart (SIGKILL every node)")
		for _, n := range a.c.Nodes() {
			n.Kill()
		}
		a.add(kind)
		time.Sleep(time.Second)
		for _, n := range a.c.Nodes() {
			if err := n.Start(); err != nil {
				return err
			}
		}
		if err := a.waitReady(ctx); err != nil {
			return err
		}
		a.say("broker fault: the cluster is back")
		return nil
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// killAndRestart SIGKILLs node id, waits until moved() (leadership left it),
// keeps it down a little longer, then restarts it on its data.
func (a *apacheFaults) killAndRestart(ctx context.Context, kind string, id int, role string, moved func() bool) error {
	n := a.c.Node(id)
	if n == nil {
		return fmt.Errorf("no node %d", id)
	}
	n.Kill()
	a.add(kind)
	deadline := time.Now().Add(30 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if moved() {
			a.add(countLeaderChanges)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	a.mu.Lock()
	down := time.Second + time.Duration(a.rng.Int64N(int64(3*time.Second)))
	a.mu.Unlock()
	a.say("broker fault: node %d (%s) SIGKILLed; restarting it in %s", id, role, down.Round(100*time.Millisecond))
	select {
	case <-time.After(down):
	case <-ctx.Done():
	}
	for attempt := 1; ; attempt++ {
		if err := n.Start(); err != nil {
			return err
		}
		err := a.waitReady(ctx)
		if err == nil || attempt == 3 || n.Running() {
			return err
		}
		a.say("node %d did not come back (%v); starting it again", id, err)
	}
}

// waitReady waits for the cluster, within the chaos context or two minutes.
func (a *apacheFaults) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	return a.c.WaitReady(ctx)
}
