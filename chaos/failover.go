package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/stack"
)

// The replicated Postgres's failovers (profile.Failover): its primary
// killed (SIGKILL of Patroni and Postgres), cut off (frozen: a partition's
// stand-in), or switched over on purpose (patronictl), one at a time, each
// once the cluster is healthy again: in synchronous mode only the standby
// the primary named may be promoted, and a failover before it named one
// would wait for the old primary to return (stack.PatroniCluster's
// WaitHealthy).
type dbFailovers struct {
	c   *stack.PatroniCluster
	say func(string, ...any)

	mu   sync.Mutex // one failover at a time
	rows []failoverRow
	wg   sync.WaitGroup
}

// failoverRow is one failover, as the report gives it.
type failoverRow struct {
	Kind string `json:"kind"`
	From string `json:"from"`
	To   string `json:"to"`
	// NoPrimaryS is the time from the fault until a primary took writes
	// again.
	NoPrimaryS float64 `json:"no_primary_s"`
	// Stalls are, per service, what the failover did to its flow
	// (measure), from the rows' own timestamps after the run.
	Stalls map[string]judge.Stall `json:"stalls,omitempty"`
	Error  string                 `json:"error,omitempty"`

	at, back time.Time // the fault, and a primary again
}

// stallBefore and stallAfter bound the window measure looks at: from
// shortly before the fault to two minutes after a primary was back (or
// the next failover, windowEnd).
const stallBefore, stallAfter = 10 * time.Second, 2 * time.Minute

// windowEnd is where failover i's window ends: stallAfter past its
// primary's return, or where the next failover began.
func (f *dbFailovers) windowEnd(i int) time.Time {
	end := f.rows[i].back.Add(stallAfter)
	for _, r := range f.rows[i+1:] {
		if !r.at.IsZero() && r.at.Before(end) {
			return r.at
		}
	}
	return end
}

// measure fills each failover's Stalls from the services' databases.
func (f *dbFailovers) measure(ctx context.Context, pools map[string]*pgxpool.Pool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.rows {
		r := &f.rows[i]
		if r.Error != "" || r.back.IsZero() {
			continue
		}
		r.Stalls = map[string]judge.Stall{}
		for svc, pool := range pools {
			st, err := judge.MeasureStall(ctx, pool, r.at.Add(-stallBefore), f.windowEnd(i), r.back)
			if err != nil {
				return fmt.Errorf("measuring %s's stall around the %s failover: %w", svc, r.Kind, err)
			}
			r.Stalls[svc] = st
		}
	}
	return nil
}

// The failover kinds.
const (
	failoverKilled = "primary_killed"
	failoverCutOff = "primary_cut_off"
	failoverSwitch = "switchover"
)

var failoverKinds = []string{failoverKilled, failoverCutOff, failoverSwitch}

// start runs failover kind in the background; wait waits for every one
// started.
func (f *dbFailovers) start(ctx context.Context, kind string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.fail(ctx, kind)
	}()
}

func (f *dbFailovers) wait() { f.wg.Wait() }

// fail makes one failover of kind and brings the old primary back as a
// replica.
func (f *dbFailovers) fail(ctx context.Context, kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	row := failoverRow{Kind: kind}
	defer func() {
		if row.Error != "" {
			f.say("postgres: %s failed: %s", kind, row.Error)
		}
		f.rows = append(f.rows, row)
	}()
	if err := f.c.WaitHealthy(ctx); err != nil {
		row.Error = "the cluster was not healthy before it: " + err.Error()
		return
	}
	old := f.c.Primary()
	if old == nil {
		row.Error = "no primary"
		return
	}
	row.From = old.Name
	if !f.c.Synchronous() && kind != failoverSwitch {
		// Asynchronous replication with replicas behind: the primary
		// commits (and answers, and the relay publishes, and the
		// consumers acknowledge) what no replica has when it dies. A
		// switchover waits for its candidate to catch up: nothing to lose.
		if err := f.lag(ctx, old); err != nil {
			row.Error = err.Error()
			return
		}
	}
	start := time.Now()
	switch kind {
	case failoverKilled:
		old.Kill()
	case failoverCutOff:
		if err := old.Freeze(); err != nil {
			row.Error = err.Error()
			return
		}
	case failoverSwitch:
		if _, err := f.c.Switchover(ctx); err != nil {
			row.Error = err.Error()
			return
		}
	}
	var next *stack.PGNode
	err := func() error {
		for {
			p, err := f.c.WaitPrimary(ctx, 3*time.Minute)
			if err != nil {
				return err
			}
			if p != old {
				next = p
				return nil
			}
		}
	}()
	row.NoPrimaryS = time.Since(start).Seconds()
	row.at, row.back = start, time.Now()
	switch kind { // the old primary returns, and Patroni makes it a replica of the new one
	case failoverKilled:
		if serr := old.Start(); err == nil {
			err = serr
		}
	case failoverCutOff:
		if terr := old.Thaw(); err == nil {
			err = terr
		}
	}
	if err != nil {
		row.Error = err.Error()
		return
	}
	row.To = next.Name
	f.say("postgres: %s: %s → %s, %.1fs without a primary", kind, row.From, row.To, row.NoPrimaryS)
}

// lagFor is how long the primary of an asynchronous cluster stops
// sending WAL before it fails: the transactions it commits meanwhile are
// the ones the failover loses (well under the test bed's
// maximum_lag_on_failover, chaos/stack's patroniMaxLag, so a replica is
// still promoted).
const lagFor = 2 * time.Second

// lag stops the primary's WAL senders, once it sends to every replica,
// and lets it commit for lagFor.
func (f *dbFailovers) lag(ctx context.Context, primary *stack.PGNode) error {
	if err := f.c.WaitStreaming(ctx); err != nil {
		return err
	}
	n, err := primary.StopSending()
	if err != nil {
		return err
	}
	f.say("postgres: %s stopped sending WAL to its %d replicas for %s: it commits on without them (asynchronous)", primary.Name, n, lagFor)
	time.Sleep(lagFor)
	return nil
}

// counts returns the failovers made, by kind: the rows without an error.
func (f *dbFailovers) counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := map[string]int{}
	for _, r := range f.rows {
		if r.Error == "" {
			n[r.Kind]++
		}
	}
	return n
}

// report returns the failovers made, in order.
func (f *dbFailovers) report() []failoverRow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]failoverRow(nil), f.rows...)
}
