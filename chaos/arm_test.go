package main

import (
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
