package main

import (
	"encoding/json"
	"testing"

	"github.com/outboxref/outbox-inbox/chaos/judge"
)

// TestProbeUnknownOutcomesSettled: a transaction commits all of its rows or
// none. Of a transaction whose COMMIT failed, one row found in the outbox
// makes all of its messages surely committed, so one missing from Kafka is
// lost; none found makes them never committed, so a copy in Kafka is a
// phantom. Judged per message (before settle), both pass.
func TestProbeUnknownOutcomesSettled(t *testing.T) {
	newWriter := func() *probeWriter {
		return &probeWriter{ledger: judge.ProbeLedger{
			"k1": {0: {ID: "m0", Tx: 1}, 1: {ID: "m1", Maybe: true, Tx: 2}},
			"k2": {0: {ID: "m2", Maybe: true, Tx: 2}, 1: {ID: "m3", Maybe: true, Tx: 3}},
		}}
	}
	rec := func(off int64, key, id string, seq int) judge.Record {
		payload, _ := json.Marshal(judge.ProbeMessage{Key: key, Seq: seq})
		return judge.Record{Topic: "t.probe", Partition: 0, Offset: off, Key: key, ID: id, Payload: payload}
	}
	// Kafka holds m0 and m1 (of transaction 2) but not m2 (also of
	// transaction 2), and m3 (transaction 3, which never committed).
	records := []judge.Record{rec(0, "k1", "m0", 0), rec(1, "k1", "m1", 1), rec(2, "k2", "m3", 1)}

	before := judge.ProbeOrder(judge.ProbeStream{Topic: "t.probe", Records: records, Ledger: newWriter().ledger})
	if before.Lost != 0 || before.Phantom != 0 {
		t.Fatalf("unsettled, the judge sees nothing wrong here: %+v", before)
	}
	w := newWriter()
	w.settle([]string{"m1"}) // the outbox holds transaction 2's row m1, nothing of transaction 3
	after := judge.ProbeOrder(judge.ProbeStream{Topic: "t.probe", Records: records, Ledger: w.ledger})
	if after.Lost != 1 || after.Phantom != 1 || w.settled != 1 {
		t.Fatalf("settled: want m2 lost and m3 a phantom, got %+v (examples %q)", after, after.Examples)
	}
}
