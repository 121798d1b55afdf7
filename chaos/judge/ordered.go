package judge

// The ordered-per-key invariant: per partition key, Kafka holds a key's
// messages in outbox commit order, across relay kills, restarts and shard
// handovers; the one deviation allowed is a repeat of a message already
// sent (a batch sent and not marked is sent again), which an inbox
// suppresses (pkg/outbox doc.go, "The order promised" and "Sharded
// relays").
//
// In the example domain every key (an order id) has one message per topic,
// so the domain topics alone could never show a key out of order. The probe
// streams can (chaos/probe.go): numbered messages the harness commits itself into
// each service's outbox. Reading a probe key's records in offset order:
//
//   - split: they all sit on one partition;
//   - reordered: the first copy of each seq comes after the first copies of
//     every lower seq (a copy of a seq already seen is a repeat, allowed; a
//     new seq below one already seen is out of order);
//   - lost: every seq whose COMMIT returned is there;
//   - phantom: every record is a seq the harness committed, surely or maybe
//     (a COMMIT that failed may have committed), under the message id it
//     gave it.
//
// On orders.events and inventory.events, per key: one partition, and the
// first copies of its messages in the order of their outbox rows' ids,
// under their rows' keys; a record no outbox wrote is a phantom, the
// hostile messages (Record.Hostile, judged by the hostile table) aside.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/services/events"
)

// ProbeEntry is one probe message a probe writer committed, or may have.
type ProbeEntry struct {
	ID    string // the message id it gave it
	Maybe bool   // its COMMIT failed: it may have committed or not
	Tx    int    // the writer's transaction that wrote it, numbered from 1
}

// ProbeLedger is what a probe writer committed: key → seq → message.
type ProbeLedger map[string]map[int]ProbeEntry

// ProbeStream is one probe topic to judge: the records of it its writer
// wrote, and its writer's ledger.
type ProbeStream struct {
	Topic   string
	Records []Record
	Ledger  ProbeLedger
}

// ProbeMessage is a probe's payload.
type ProbeMessage struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// TopicOrder is what ordered-per-key found on one topic.
type TopicOrder struct {
	Topic    string `json:"topic"`
	Probe    bool   `json:"probe"` // a probe stream: it must have keys with an order to check
	Keys     int    `json:"keys"`
	Messages int    `json:"messages"` // distinct messages: first copies
	Repeats  int    `json:"repeats"`  // copies of a message already there
	// KeysOrdered is how many keys have more than one message, so an order
	// to check.
	KeysOrdered int `json:"keys_ordered"`
	// Probe streams: messages whose COMMIT returned, messages whose COMMIT
	// failed (outcome unknown), and how many of those are in Kafka.
	Committed  int `json:"committed,omitempty"`
	Maybe      int `json:"maybe,omitempty"`
	MaybeThere int `json:"maybe_there,omitempty"`
	// Unpositioned are the domain topics' messages no outbox row places
	// (the hostile messages), left out of the order check.
	Unpositioned int `json:"unpositioned,omitempty"`

	Split     int `json:"split"`     // keys on more than one partition
	Reordered int `json:"reordered"` // first copies after a later message's
	// ReorderedAcrossTx are the probe streams' reordered first copies whose
	// later message came from another transaction, not the same one.
	ReorderedAcrossTx int      `json:"reordered_across_transactions"`
	Lost              int      `json:"lost"`    // probe messages committed and not there
	Phantom           int      `json:"phantom"` // probe records never committed
	Examples          []string `json:"examples,omitempty"`
}

func (t *TopicOrder) violations() int { return t.Split + t.Reordered + t.Lost + t.Phantom }

func (t *TopicOrder) example(format string, args ...any) {
	if len(t.Examples) < maxExamples {
		t.Examples = append(t.Examples, fmt.Sprintf(format, args...))
	}
}

// byKey groups records by key, each key's in partition and offset order.
func byKey(records []Record) map[string][]Record {
	m := map[string][]Record{}
	for _, r := range records {
		m[r.Key] = append(m[r.Key], r)
	}
	for _, rs := range m {
		slices.SortFunc(rs, func(a, b Record) int {
			return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
		})
	}
	return m
}

// partitions lists the partitions records sit on.
func partitions(records []Record) []int32 {
	var ps []int32
	for _, r := range records {
		if !slices.Contains(ps, r.Partition) {
			ps = append(ps, r.Partition)
		}
	}
	return ps
}

// ProbeOrder holds a probe stream's records to the ledger of what was
// committed into it.
func ProbeOrder(p ProbeStream) TopicOrder {
	records, ledger := p.Records, p.Ledger
	t := TopicOrder{Topic: p.Topic, Probe: true}
	keys := byKey(records)
	all := map[string]bool{}
	for k := range keys {
		all[k] = true
	}
	for k, seqs := range ledger {
		all[k] = true
		for _, e := range seqs {
			if e.Maybe {
				t.Maybe++
			} else {
				t.Committed++
			}
		}
	}
	for _, key := range sortedKeys(all) {
		t.Keys++
		judgeProbeKey(&t, key, keys[key], ledger[key])
	}
	return t
}

// judgeProbeKey walks one probe key's records in offset order.
func judgeProbeKey(t *TopicOrder, key string, records []Record, committed map[int]ProbeEntry) {
	parts := partitions(records)
	if len(parts) > 1 {
		// Offsets of two partitions have no order between them: the
		// order check below is left out, the split is the violation.
		t.Split++
		t.example("key %s on partitions %v", key, parts)
	}
	seen := map[int]bool{}
	top, topAt := -1, ""
	for _, r := range records {
		at := fmt.Sprintf("%d/%d", r.Partition, r.Offset)
		var p ProbeMessage
		if err := json.Unmarshal(r.Payload, &p); err != nil || p.Key != key {
			t.Phantom++
			t.example("key %s: record %s is not one of its probe messages: %q", key, at, r.Payload)
			continue
		}
		e, ok := committed[p.Seq]
		switch {
		case !ok || e.ID != r.ID:
			t.Phantom++
			t.example("key %s: seq %d (message %s) at %s was never committed", key, p.Seq, r.ID, at)
		case seen[p.Seq]:
			t.Repeats++
		default:
			seen[p.Seq] = true
			t.Messages++
			if e.Maybe {
				t.MaybeThere++
			}
			if p.Seq < top && len(parts) == 1 {
				t.Reordered++
				txs := fmt.Sprintf("both of transaction %d", e.Tx)
				if later := committed[top].Tx; later != e.Tx {
					t.ReorderedAcrossTx++
					txs = fmt.Sprintf("transactions %d and %d", e.Tx, later)
				}
				t.example("key %s: seq %d first arrived at %s, after seq %d at %s (%s)", key, p.Seq, at, top, topAt, txs)
			}
			if p.Seq > top {
				top, topAt = p.Seq, at
			}
		}
	}
	if len(seen) > 1 {
		t.KeysOrdered++
	}
	for _, seq := range slices.Sorted(maps.Keys(committed)) {
		if !seen[seq] && !committed[seq].Maybe {
			t.Lost++
			t.example("key %s: seq %d (message %s) committed, not in Kafka", key, seq, committed[seq].ID)
		}
	}
}

// outboxRow is where the producer's outbox placed a message, and under
// which key.
type outboxRow struct {
	pos int64 // outbox_messages.id: commit order per key
	key string
}

// HostileKeyPrefix keys the hostile messages the chaos driver puts on the
// event topics itself (chaos/hostile.go) whose payload names no order.
const HostileKeyPrefix = "hostile-"

// judgeDomain holds an event topic's records to their outbox rows:
// position is message id → its row in the producer's outbox. A record
// under another key than its row's, or one no outbox wrote (a hostile
// message aside), is a phantom.
func judgeDomain(topic string, records []Record, position map[string]outboxRow) TopicOrder {
	t := TopicOrder{Topic: topic}
	var own []Record
	for _, r := range records {
		if r.Hostile != "" {
			t.Unpositioned++ // the hostile table judges it
			continue
		}
		own = append(own, r)
	}
	keys := byKey(own)
	for _, key := range sortedKeys(keys) {
		t.Keys++
		rs := keys[key]
		parts := partitions(rs)
		if len(parts) > 1 {
			t.Split++
			t.example("key %s on partitions %v", key, parts)
		}
		seen := map[string]bool{}
		positioned := 0
		var top int64 = -1
		topID := ""
		for _, r := range rs {
			if seen[r.ID] {
				t.Repeats++
				continue
			}
			seen[r.ID] = true
			t.Messages++
			row, ok := position[r.ID]
			switch {
			case !ok:
				t.Phantom++
				t.example("key %s: message %s at %d/%d was written by no outbox", key, r.ID, r.Partition, r.Offset)
				continue
			case row.key != key:
				t.Phantom++
				t.example("key %s: message %s at %d/%d is its outbox row's under key %s", key, r.ID, r.Partition, r.Offset, row.key)
				continue
			}
			pos := row.pos
			positioned++
			if pos < top && len(parts) == 1 {
				t.Reordered++
				t.example("key %s: message %s (outbox row %d) first arrived at %d/%d, after message %s (row %d)",
					key, r.ID, pos, r.Partition, r.Offset, topID, top)
			}
			if pos > top {
				top, topID = pos, r.ID
			}
		}
		if positioned > 1 {
			t.KeysOrdered++
		}
	}
	return t
}

// OrderedVerdict judges the topics and says what was checked.
func OrderedVerdict(topics []TopicOrder) (ok bool, detail string) {
	var parts, bad []string
	for _, t := range topics {
		s := fmt.Sprintf("%s %d keys, %d messages (%d with an order to check), %d repeats", t.Topic, t.Keys, t.Messages, t.KeysOrdered, t.Repeats)
		if t.Probe {
			s = fmt.Sprintf("%s %d keys (%d with an order to check), %d messages in Kafka of %d committed and %d of unknown outcome (%d of those there), %d repeats",
				t.Topic, t.Keys, t.KeysOrdered, t.Messages, t.Committed, t.Maybe, t.MaybeThere, t.Repeats)
		}
		if t.Unpositioned > 0 {
			s += fmt.Sprintf(", %d not from an outbox (order unchecked)", t.Unpositioned)
		}
		parts = append(parts, s)
		if t.violations() > 0 {
			reordered := fmt.Sprint(t.Reordered)
			if t.Probe {
				reordered += fmt.Sprintf(" (%d across transactions)", t.ReorderedAcrossTx)
			}
			bad = append(bad, fmt.Sprintf("%s: %d split, %s reordered, %d lost, %d phantom: %s",
				t.Topic, t.Split, reordered, t.Lost, t.Phantom, strings.Join(t.Examples, "; ")))
		}
		if t.Probe && t.KeysOrdered == 0 {
			// A probe stream that wrote nothing (its pool never
			// connected, say) would pass by proving nothing.
			bad = append(bad, t.Topic+": no key with more than one message in Kafka: the probe stream proves nothing")
		}
	}
	detail = "each key on one partition, first copies in commit order: " + strings.Join(parts, "; ")
	if len(bad) > 0 {
		detail = strings.Join(bad, " | ") + " | checked: " + strings.Join(parts, "; ")
	}
	return len(bad) == 0, detail
}

// MeasureKeyOrder measures what Kafka holds: each probe stream against its
// writer's ledger, each event topic against its producer's outbox.
func MeasureKeyOrder(ctx context.Context, db Databases, records []Record, probes []ProbeStream) ([]TopicOrder, error) {
	on := map[string][]Record{}
	for _, r := range records {
		on[r.Topic] = append(on[r.Topic], r)
	}
	var topics []TopicOrder
	for _, p := range probes {
		topics = append(topics, ProbeOrder(p))
	}
	for _, src := range []struct {
		producer string
		pool     *pgxpool.Pool
		topic    string
	}{{"orders", db.Orders, events.TopicOrders}, {"inventory", db.Inventory, events.TopicInventory}} {
		rows, err := src.pool.Query(ctx, `SELECT message_id::text, id, partition_key FROM outbox_messages WHERE topic = $1`, src.topic)
		if err != nil {
			return nil, fmt.Errorf("reading %s's outbox: %w", src.producer, err)
		}
		position := map[string]outboxRow{}
		var id string
		var row outboxRow
		if _, err := pgx.ForEachRow(rows, []any{&id, &row.pos, &row.key}, func() error { position[id] = row; return nil }); err != nil {
			return nil, fmt.Errorf("reading %s's outbox: %w", src.producer, err)
		}
		topics = append(topics, judgeDomain(src.topic, on[src.topic], position))
	}
	return topics, nil
}
