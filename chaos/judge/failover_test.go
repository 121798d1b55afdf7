package judge

import (
	"strings"
	"testing"
)

func set(ids ...string) map[string]bool {
	m := map[string]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// TestGhostsVerdict: an applied event whose outbox row is gone is a ghost,
// named; one the harness forged is not judged; a clean flow passes.
func TestGhostsVerdict(t *testing.T) {
	clean := FlowState{Topic: "orders.events", Outbox: set("a", "b", "c"), Applied: set("a", "b")}
	if ok, d := GhostsVerdict([]FlowState{clean}, nil); !ok {
		t.Fatalf("a clean flow: %s", d)
	}
	lossy := FlowState{Topic: "orders.events", Outbox: set("a"), Applied: set("a", "b", "forged")}
	ok, d := GhostsVerdict([]FlowState{clean, lossy}, set("forged"))
	if ok || !strings.Contains(d, "orders.events b") || strings.Contains(d, "forged") || !strings.Contains(d, "1 of 4") {
		t.Fatalf("a lost outbox row: %v %s", ok, d)
	}
}

// TestCommittedVerdict: a record below the committed offset that no inbox
// recorded is lost, named; records at or past the offset, of partitions
// the group never committed, of other topics, and the harness's own are
// not judged.
func TestCommittedVerdict(t *testing.T) {
	f := FlowState{Topic: "orders.events", Recorded: set("a", "b"), Committed: map[int32]int64{0: 2, 1: 1}}
	records := []Record{
		{Topic: "orders.events", Partition: 0, Offset: 0, ID: "a"},
		{Topic: "orders.events", Partition: 0, Offset: 1, ID: "b"},
		{Topic: "orders.events", Partition: 0, Offset: 2, ID: "c"},      // past the committed offset
		{Topic: "orders.events", Partition: 2, Offset: 0, ID: "d"},      // never committed
		{Topic: "inventory.events", Partition: 0, Offset: 0, ID: "e"},   // another flow's
		{Topic: "orders.events", Partition: 1, Offset: 0, ID: "forged"}, // the harness's
	}
	if ok, d := CommittedVerdict([]FlowState{f}, records, set("forged")); !ok || !strings.Contains(d, "2 records") {
		t.Fatalf("every committed record recorded: %v %s", ok, d)
	}
	records = append(records, Record{Topic: "orders.events", Partition: 1, Offset: 0, ID: "x"})
	ok, d := CommittedVerdict([]FlowState{f}, records, set("forged"))
	if ok || !strings.Contains(d, "orders.events/1@0 x") {
		t.Fatalf("a committed record no inbox has: %v %s", ok, d)
	}
}
