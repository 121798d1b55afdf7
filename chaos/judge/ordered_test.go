package judge

import (
	"fmt"
	"strings"
	"testing"
)

// probeID is the message id the tests' ledger gives key's seq.
func probeID(key string, seq int) string { return fmt.Sprintf("id-%s-%d", key, seq) }

// arrivals builds a probe topic's records: key k's seqs on partition p, in
// offset order, as "p:k:seq seq …".
func arrivals(spec ...string) []Record {
	var records []Record
	offsets := map[int32]int64{}
	for _, s := range spec {
		var p int32
		var key string
		head, list, _ := strings.Cut(s, " ")
		if _, err := fmt.Sscanf(strings.Replace(head, ":", " ", 2), "%d %s", &p, &key); err != nil {
			panic(s)
		}
		for _, f := range strings.Fields(list) {
			var seq int
			fmt.Sscan(f, &seq) //nolint:errcheck // the tests' own spelling
			records = append(records, Record{Topic: "t.probe", Partition: p, Offset: offsets[p], Key: key,
				ID: probeID(key, seq), Payload: fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, seq)})
			offsets[p]++
		}
	}
	return records
}

// ledgerOf says what was committed: sure seqs and maybe seqs per key, each
// seq s in transaction s+1.
func ledgerOf(key string, sure []int, maybe ...int) ProbeLedger {
	l := ProbeLedger{key: {}}
	for _, s := range sure {
		l[key][s] = ProbeEntry{ID: probeID(key, s), Tx: s + 1}
	}
	for _, s := range maybe {
		l[key][s] = ProbeEntry{ID: probeID(key, s), Maybe: true, Tx: s + 1}
	}
	return l
}

// oneTx puts seqs of key in one transaction.
func oneTx(l ProbeLedger, key string, tx int, seqs ...int) ProbeLedger {
	for _, s := range seqs {
		e := l[key][s]
		e.Tx = tx
		l[key][s] = e
	}
	return l
}

func seqs(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestOrderedProbes: the judge of the probe streams, each violation alone,
// and what it must let pass.
func TestOrderedProbes(t *testing.T) {
	cases := []struct {
		name    string
		records []Record
		ledger  ProbeLedger
		want    TopicOrder // the counts compared; Examples must name the violation
		example string
	}{
		{name: "in order", records: arrivals("0:k 0 1 2 3"), ledger: ledgerOf("k", seqs(4)),
			want: TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 4}},
		{name: "first copies reordered", records: arrivals("0:k 0 2 1 3"), ledger: ledgerOf("k", seqs(4)),
			want:    TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 4, Reordered: 1, ReorderedAcrossTx: 1},
			example: "key k: seq 1 first arrived at 0/2, after seq 2 at 0/1 (transactions 2 and 3)"},
		{name: "first copies of one transaction reordered", records: arrivals("0:k 0 2 1 3"), ledger: oneTx(ledgerOf("k", seqs(4)), "k", 2, 1, 2),
			want:    TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 4, Reordered: 1},
			example: "key k: seq 1 first arrived at 0/2, after seq 2 at 0/1 (both of transaction 2)"},
		{name: "a gap: seq 2 lost", records: arrivals("0:k 0 1 3"), ledger: ledgerOf("k", seqs(4)),
			want:    TopicOrder{Keys: 1, Messages: 3, KeysOrdered: 1, Committed: 4, Lost: 1},
			example: "key k: seq 2 (message id-k-2) committed, not in Kafka"},
		{name: "a key with nothing in Kafka", records: nil, ledger: ledgerOf("k", seqs(2)),
			want:    TopicOrder{Keys: 1, Committed: 2, Lost: 2},
			example: "key k: seq 0 (message id-k-0) committed, not in Kafka"},
		{name: "a phantom seq, never committed (a rolled-back one)", records: arrivals("0:k 0 1 2 3"), ledger: ledgerOf("k", seqs(3)),
			want:    TopicOrder{Keys: 1, Messages: 3, KeysOrdered: 1, Committed: 3, Phantom: 1},
			example: "key k: seq 3 (message id-k-3) at 0/3 was never committed"},
		{name: "a committed seq under another message id", records: arrivals("0:k 0 1"),
			ledger:  ProbeLedger{"k": {0: {ID: probeID("k", 0)}, 1: {ID: "another"}}},
			want:    TopicOrder{Keys: 1, Messages: 1, Committed: 2, Phantom: 1, Lost: 1},
			example: "key k: seq 1 (message id-k-1) at 0/1 was never committed"},
		{name: "a key split across two partitions", records: arrivals("0:k 0 1", "3:k 2 3"), ledger: ledgerOf("k", seqs(4)),
			want:    TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 4, Split: 1},
			example: "key k on partitions [0 3]"},
		{name: "a re-sent suffix", records: arrivals("0:k 0 1 2 3 2 3 4"), ledger: ledgerOf("k", seqs(5)),
			want: TopicOrder{Keys: 1, Messages: 5, KeysOrdered: 1, Committed: 5, Repeats: 2}},
		{name: "maybe seqs missing", records: arrivals("0:k 0 1 3"), ledger: ledgerOf("k", []int{0, 1, 3}, 2, 4),
			want: TopicOrder{Keys: 1, Messages: 3, KeysOrdered: 1, Committed: 3, Maybe: 2}},
		{name: "a maybe seq there, in order", records: arrivals("0:k 0 1 2 3"), ledger: ledgerOf("k", []int{0, 1, 3}, 2),
			want: TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 3, Maybe: 1, MaybeThere: 1}},
		{name: "a maybe seq there, out of order", records: arrivals("0:k 0 1 3 2"), ledger: ledgerOf("k", []int{0, 1, 3}, 2),
			want:    TopicOrder{Keys: 1, Messages: 4, KeysOrdered: 1, Committed: 3, Maybe: 1, MaybeThere: 1, Reordered: 1, ReorderedAcrossTx: 1},
			example: "key k: seq 2 first arrived at 0/3, after seq 3 at 0/2 (transactions 3 and 4)"},
		{name: "nothing committed, nothing in Kafka: no order was checked", records: nil, ledger: ProbeLedger{},
			want: TopicOrder{}},
		{name: "a record that is no probe message", records: []Record{{Key: "k", Payload: []byte("x")}}, ledger: ProbeLedger{},
			want:    TopicOrder{Keys: 1, Phantom: 1},
			example: `key k: record 0/0 is not one of its probe messages: "x"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ProbeOrder(ProbeStream{Topic: "t.probe", Records: c.records, Ledger: c.ledger})
			examples := got.Examples
			got.Examples, c.want.Topic, c.want.Probe = nil, "t.probe", true
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if c.example == "" && len(examples) > 0 || c.example != "" && (len(examples) == 0 || examples[0] != c.example) {
				t.Errorf("examples %q; want %q first", examples, c.example)
			}
			ok, detail := OrderedVerdict([]TopicOrder{ProbeOrder(ProbeStream{Topic: "t.probe", Records: c.records, Ledger: c.ledger})})
			if ok != (c.example == "" && c.want.KeysOrdered > 0) {
				t.Errorf("verdict %v: %s", ok, detail)
			}
		})
	}
}

// TestOrderedEvents: the event topics' keys are held to their outbox rows'
// order and to one partition, under its row's key; a hostile message is
// left out of the order, a message no outbox wrote is a phantom, and
// repeats are allowed.
func TestOrderedEvents(t *testing.T) {
	rec := func(p int32, off int64, key, id string) Record {
		return Record{Topic: "orders.events", Partition: p, Offset: off, Key: key, ID: id}
	}
	hostile := func(r Record) Record { r.Hostile = "some_class"; return r } // under a real key, on another partition, written by no outbox
	position := map[string]outboxRow{"a": {10, "o-1"}, "b": {20, "o-1"}, "c": {30, "o-2"}}
	cases := []struct {
		name    string
		records []Record
		want    TopicOrder
		example string
	}{
		{name: "in order, with a repeat and a hostile message",
			records: []Record{rec(1, 0, "o-1", "a"), hostile(rec(3, 1, "o-1", "z")), rec(1, 2, "o-1", "b"), rec(1, 3, "o-1", "a"), rec(2, 0, "o-2", "c")},
			want:    TopicOrder{Keys: 2, Messages: 3, Repeats: 1, KeysOrdered: 1, Unpositioned: 1}},
		{name: "a message no outbox wrote",
			records: []Record{rec(1, 0, "o-1", "a"), rec(1, 1, "o-1", "z"), rec(1, 2, "o-1", "b")},
			want:    TopicOrder{Keys: 1, Messages: 3, KeysOrdered: 1, Phantom: 1},
			example: "key o-1: message z at 1/1 was written by no outbox"},
		{name: "a message under another key than its row's",
			records: []Record{rec(1, 0, "o-1", "a"), rec(1, 1, "o-1", "c")},
			want:    TopicOrder{Keys: 1, Messages: 2, Phantom: 1},
			example: "key o-1: message c at 1/1 is its outbox row's under key o-2"},
		{name: "out of outbox order",
			records: []Record{rec(1, 0, "o-1", "b"), rec(1, 1, "o-1", "a")},
			want:    TopicOrder{Keys: 1, Messages: 2, KeysOrdered: 1, Reordered: 1},
			example: "key o-1: message a (outbox row 10) first arrived at 1/1, after message b (row 20)"},
		{name: "split",
			records: []Record{rec(1, 0, "o-1", "a"), rec(2, 0, "o-1", "a")},
			want:    TopicOrder{Keys: 1, Messages: 1, Repeats: 1, Split: 1},
			example: "key o-1 on partitions [1 2]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := judgeDomain("orders.events", c.records, position)
			examples := got.Examples
			got.Examples, c.want.Topic = nil, "orders.events"
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
			if c.example == "" && len(examples) > 0 || c.example != "" && (len(examples) == 0 || examples[0] != c.example) {
				t.Errorf("examples %q; want %q first", examples, c.example)
			}
		})
	}
}
