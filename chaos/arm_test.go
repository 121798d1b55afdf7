package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// armedWindow arms an incarnation of service until it is armed (some are
// left unarmed at random) and returns its window.
func armedWindow(t *testing.T, h *harness, service string) failpoint.Name {
	t.Helper()
	p := &procs.Proc{Service: service, Name: service + "-1"}
	for range 100 {
		for _, kv := range h.arm(p) {
			if spec, ok := strings.CutPrefix(kv, "FAILPOINTS="); ok {
				h.exited(p)
				w, _, _ := strings.Cut(spec, "=")
				return failpoint.Name(w)
			}
		}
	}
	t.Fatalf("%s was never armed", service)
	return ""
}

// ordersOnly reports whether only orders' code reaches w.
func ordersOnly(w failpoint.Name) bool {
	return w == failpoint.AfterCommitBeforeResponse || judge.EffectWindow(w)
}

// TestArmWeighsWindowsByWhoCanMeetThem: orders' incarnations are the only
// ones that meet its payment and capture windows, so they go there while
// the windows both services meet are at least half as far along, and not
// to a shared window that is merely one kill behind.
func TestArmWeighsWindowsByWhoCanMeetThem(t *testing.T) {
	for _, tc := range []struct {
		name              string
		shared, exclusive int // kills so far in each shared window, each orders-only one
		wantOrdersOnly    bool
	}{
		{"orders' own windows a little ahead", 10, 12, true},
		{"orders' own windows twice as far", 10, 21, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(profile{Name: "test"}, 7, true, true, true)
			for _, w := range windowsFor("orders", true) {
				if ordersOnly(w) {
					h.fired[svcWindow{"orders", w}] = tc.exclusive
				} else {
					h.fired[svcWindow{"orders", w}] = 1 // met once: not a first meeting
					h.fired[svcWindow{"inventory", w}] = tc.shared - 1
				}
			}
			for range 20 {
				if w := armedWindow(t, h, "orders"); ordersOnly(w) != tc.wantOrdersOnly {
					t.Fatalf("orders armed %s (orders-only: %t), want orders-only %t", w, ordersOnly(w), tc.wantOrdersOnly)
				}
			}
			// Inventory meets only shared windows, whatever the counts.
			if w := armedWindow(t, h, "inventory"); ordersOnly(w) {
				t.Fatalf("inventory armed %s, a window its code does not reach", w)
			}
		})
	}
}

// TestArmCountsNoHostileKillAsAMeeting: an orders incarnation killed at
// after-commit-before-ack on a hostile message has not met the window
// attribution asks of it (a kill of orders' own messages), so the next
// incarnation is armed there again, first.
func TestArmCountsNoHostileKillAsAMeeting(t *testing.T) {
	h := newHarness(profile{Name: "test"}, 7, true, true, true)
	h.pids[100] = "orders"
	h.noteHostile(map[string]bool{"forged-1": true})
	h.countFired(judge.Log{Kills: []judge.Kill{{Window: failpoint.AfterCommitBeforeAck, Pid: 100, Subject: "forged-1"}}})
	if n := h.fired[svcWindow{"orders", failpoint.AfterCommitBeforeAck}]; n != 0 {
		t.Errorf("a kill on a hostile message counted as %d meeting(s) of orders' after-commit-before-ack", n)
	}
	// The log had no other kill: every window is unmet, and of those
	// after-commit-before-ack comes first (it would come after every
	// other unmet one had the hostile kill counted).
	for range 10 {
		if w := armedWindow(t, h, "orders"); w != failpoint.AfterCommitBeforeAck {
			t.Fatalf("orders armed %s, want %s: it has not met it with a message of its own", w, failpoint.AfterCommitBeforeAck)
		}
	}
}

// TestShortNamesWhatTheRunHasNotReached: the top-up (topUp) goes on while a
// window its services reach is below the profile's kills, or the kills in
// all are, as the failpoint log counts them; a window no service reaches
// with the inbox off is not waited for.
func TestShortNamesWhatTheRunHasNotReached(t *testing.T) {
	h := newHarness(profile{MinPerWindow: 2, MinKills: 30}, 7, true, true, true)
	h.fpLog = t.TempDir() + "/failpoints.log"
	var log strings.Builder
	kill := func(w failpoint.Name, n int) {
		for range n {
			fmt.Fprintf(&log, "failpoint %s fired: SIGKILL pid 100 subject s-%d\n", w, log.Len())
		}
	}
	write := func() {
		t.Helper()
		if err := os.WriteFile(h.fpLog, []byte(log.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	log.Reset()
	for _, w := range failpoint.All {
		n := 2
		if w == failpoint.AfterEffectBeforeRecord {
			n = 1
		}
		kill(w, n)
	}
	write()
	want := []string{"after-effect-before-record fired 1 of 2", fmt.Sprintf("%d kills of 30", 2*len(failpoint.All)-1)}
	if got := h.short(); !slices.Equal(got, want) {
		t.Errorf("short = %q, want %q", got, want)
	}
	h.randomKills.Store(int64(30 - 2*len(failpoint.All)))
	kill(failpoint.AfterEffectBeforeRecord, 1)
	write()
	if got := h.short(); len(got) != 0 {
		t.Errorf("every window at its minimum and %d kills in all: short = %q, want nothing", 30, got)
	}

	off := newHarness(profile{MinPerWindow: 2}, 7, false, true, true)
	off.fpLog = h.fpLog
	for _, s := range off.short() {
		if w, _, _ := strings.Cut(s, " "); !reached(failpoint.Name(w), false) {
			t.Errorf("with the inbox off, short names %q, a window no service reaches", s)
		}
	}
}

// TestMustFailIsTheMakefilesControls: the runs the Makefile requires to
// fail are not topped up; the runs it requires to pass are, the guard's
// control (the inbox off alone) and asynchronous failovers with a standby
// among them.
func TestMustFailIsTheMakefilesControls(t *testing.T) {
	for _, tc := range []struct {
		name               string
		p                  profile
		inbox, guard, keys bool
		want               bool
	}{
		{"the proof", profile{}, true, true, true, false},
		{"control 1: the inbox off, the guard on", profile{}, false, true, true, false},
		{"control 2: the inbox and the guard off", profile{}, false, false, true, true},
		{"control 3: parallel relays", profile{RelayParallel: true}, true, true, true, true},
		{"the effect control", profile{}, true, true, false, true},
		{"the failover control", profile{Failover: "async"}, true, true, true, true},
		{"asynchronous with a standby", profile{Failover: "async", Standbys: 1}, true, true, true, false},
		{"synchronous", profile{Failover: "sync"}, true, true, true, false},
	} {
		if got := newHarness(tc.p, 7, tc.inbox, tc.guard, tc.keys).mustFail(); got != tc.want {
			t.Errorf("%s: mustFail = %v, want %v", tc.name, got, tc.want)
		}
	}
}
