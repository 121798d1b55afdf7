package main

import (
	"fmt"
	"testing"
	"time"
)

// syntheticRound records a round at 100 rows/s with phases of 10 s:
// quiet reads each row 5 ms after its commit; broker_kill reads nothing for
// its first 3 s, then everything waiting at once and keeps up; leader_change
// keeps up; in after the reader stops at 5 s and the rest is never read.
func syntheticRound() (faultRound, faultParams) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	stallEnd, readerGone := t0.Add(13*time.Second), t0.Add(35*time.Second)
	return recordRound(t0, func(at time.Time) (time.Time, bool) {
		read := at.Add(5 * time.Millisecond)
		if !at.Before(t0.Add(10*time.Second)) && read.Before(stallEnd) {
			read = stallEnd
		}
		return read, read.Before(readerGone)
	})
}

// recordRound is a round from t0 at 100 rows/s, phases of 10 s, each row
// read when readAt says (if it is read at all), with the backlog sampled
// from those.
func recordRound(t0 time.Time, readAt func(committed time.Time) (time.Time, bool)) (faultRound, faultParams) {
	p := faultParams{Rate: 100, PhaseS: 10}
	r := faultRound{committed: map[string]time.Time{}, read: map[string]time.Time{}, acked: map[string]time.Time{}}
	for i := range 4 {
		r.starts = append(r.starts, t0.Add(time.Duration(i)*10*time.Second))
		r.ends = append(r.ends, t0.Add(time.Duration(i+1)*10*time.Second))
	}
	for i := range 4000 {
		at := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		id := fmt.Sprint(i)
		r.committed[id] = at
		if read, ok := readAt(at); ok {
			r.read[id] = read
			r.acked[id] = read.Add(-3 * time.Millisecond) // acknowledged 3 ms before it is read
		}
	}
	for at := t0; at.Before(t0.Add(40 * time.Second)); at = at.Add(100 * time.Millisecond) {
		n := 0
		for id, c := range r.committed {
			if !c.After(at) {
				if rd, ok := r.read[id]; !ok || rd.After(at) {
					n++
				}
			}
		}
		r.samples = append(r.samples, backlogSample{at, n})
	}
	return r, p
}

func TestPhaseFigures(t *testing.T) {
	r, p := syntheticRound()
	got := map[string]FaultPhase{}
	for _, ph := range phaseFigures(r, p) {
		got[ph.Phase] = ph
	}
	if len(got) != len(faultPhases) {
		t.Fatalf("got %d phases, want %d", len(got), len(faultPhases))
	}
	quiet := got[phaseQuiet]
	if !quiet.Sustainable || quiet.OfferedPerS != 100 || quiet.PublishedPerS != 100 || quiet.LatencyMS.P99 != 5 || quiet.RelayMS.P99 != 2 || quiet.Unread != 0 {
		t.Errorf("quiet: %+v; want sustainable, 100/s offered and published, p99 5 ms (2 ms until acknowledged)", quiet)
	}
	kill := got[phaseBrokerKill]
	if !kill.Sustainable || kill.MaxMS < 2990 || kill.BacklogPeak < 290 || kill.RecoveredS < 2.9 || kill.RecoveredS > 3.1 {
		t.Errorf("broker_kill: %+v; want sustainable, a 3 s stall (max ~3000 ms, backlog peak ~300), recovered after ~3 s", kill)
	}
	if lc := got[phaseLeaderChange]; !lc.Sustainable || lc.RecoveredS != 0 {
		t.Errorf("leader_change: %+v; want sustainable, never behind", lc)
	}
	after := got[phaseAfter]
	if after.Sustainable || after.Unread != 500 || after.PublishedPerS != 50 {
		t.Errorf("after: %+v; want not sustainable, 500 rows unread, 50/s published", after)
	}
	phases, ratios := medianPhases([]faultRound{r, r}, p)
	if len(phases) != 4 || phases[3].Sustainable || !phases[1].Sustainable {
		t.Errorf("medians over rounds: %+v", phases)
	}
	if got := ratios["published/offered@"+phaseAfter]; got != 0.5 {
		t.Errorf("published/offered in after = %v, want 0.5", got)
	}
	if got := ratios["p99_vs_quiet@"+phaseBrokerKill]; got < 100 {
		t.Errorf("p99 of broker_kill over quiet = %v, want the stall's ~3000/5", got)
	}
}

func TestMostLeading(t *testing.T) {
	if n, led := mostLeading(map[int32]int{0: 2, 1: 3, 2: 2, 3: 1}); n != 2 || led != 2 {
		t.Errorf("mostLeading = node %d, %d partitions; want node 2, 2", n, led)
	}
}

// TestPhaseFiguresGrowingBacklog: a reader that falls a little further
// behind all along the phase publishes 96% of what is offered and loses
// nothing, but its backlog grows: not sustainable.
func TestPhaseFiguresGrowingBacklog(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	after := t0.Add(30 * time.Second)
	r, p := recordRound(t0, func(at time.Time) (time.Time, bool) {
		if at.Before(after) {
			return at.Add(5 * time.Millisecond), true
		}
		return at.Add(5*time.Millisecond + at.Sub(after)/24), true // 1/24 behind per second
	})
	ph := phaseFigures(r, p)[3]
	if ph.Sustainable || ph.PublishedPerS < 95 || ph.Unread != 0 || ph.BacklogEnd <= ph.BacklogStart+25 {
		t.Errorf("after: %+v; want not sustainable, with >= 95/s published, nothing unread and the backlog grown by more than 25", ph)
	}
}

// TestPhaseFiguresNoRecovery: a reader that stops 2 s into the broker kill
// never brings the backlog back: not recovered within the phase.
func TestPhaseFiguresNoRecovery(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	r, p := recordRound(t0, func(at time.Time) (time.Time, bool) {
		read := at.Add(5 * time.Millisecond)
		return read, read.Before(t0.Add(12 * time.Second))
	})
	kill := phaseFigures(r, p)[1]
	if kill.RecoveredS != -1 || kill.Sustainable {
		t.Errorf("broker_kill: %+v; want not recovered, not sustainable", kill)
	}
}
