package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// record is one Kafka record written with a client of the test's own: any
// value (nil: none at all), any key (nil: none), any headers.
type record struct {
	shape   string
	topic   string
	id      []byte // the message id header; nil: no such header
	key     []byte
	value   []byte
	headers map[string][]byte
	// What its consumer's inbox_quarantine must hold for it.
	kind, storedID, reason string
}

// TestHostileRecordsNeverStall writes records of every shape a Kafka client
// can produce onto both event topics, among a load of genuine orders: no
// value, an empty or binary one, JSON of another shape, headers and keys
// that are not text or not there, a message id header that is not text or
// missing. Every genuine order must settle (no record stalls its partition)
// and every record must end in its consumer's quarantine with a reason.
// Before the quarantine stored records as they arrived, the records with no
// value were never settled and the genuine orders behind them waited.
func TestHostileRecordsNeverStall(t *testing.T) {
	t.Parallel()
	// Unsigned: every shape must reach the inbox's own checks and the
	// handler, as a trusted producer's bug would. Signed, each would be
	// quarantined before them as not authenticated (forged_test.go).
	b := setup(t, system.Options{Unsigned: true})
	var records []record
	for _, c := range []struct{ topic, prefix string }{{events.TopicOrders, "op"}, {events.TopicInventory, "ir"}} {
		id := func() []byte { return []byte(uuid.Must(uuid.NewV7()).String()) }
		dead := func(shape string, value []byte) record {
			return record{shape: c.prefix + "-" + shape, topic: c.topic, id: id(), key: []byte("hostile-" + shape), value: value, kind: "dead_letter"}
		}
		records = append(records,
			dead("no-value", nil),
			dead("empty-value", []byte{}),
			dead("binary-value", []byte("\x00\xff\xfe{\"schema_version\":1}\xc3\x28")),
			dead("json-null", []byte("null")),
			dead("json-array", []byte("[]")),
			dead("json-string", []byte(`"OrderPaid"`)),
			dead("json-number", []byte("1")),
			record{shape: c.prefix + "-no-key-no-value", topic: c.topic, id: id(), key: nil, value: nil, kind: "dead_letter"},
			record{shape: c.prefix + "-binary-key", topic: c.topic, id: id(), key: []byte("hostile-\xff\x00"), value: []byte("{"), kind: "dead_letter"},
			record{shape: c.prefix + "-headers-not-text", topic: c.topic, id: id(), key: []byte("hostile-headers"), value: []byte("{"), kind: "dead_letter",
				headers: map[string][]byte{"x-nul": []byte("a\x00b"), "x-\xff": []byte("caf\xe9"), "traceparent": []byte("\x00garbage")}},
			record{shape: c.prefix + "-long-key", topic: c.topic, id: id(), key: append(bytes.Repeat([]byte("k"), 64<<10), 0xff), value: []byte("{"), kind: "dead_letter"},
			record{shape: c.prefix + "-huge-header", topic: c.topic, id: id(), key: []byte("hostile-huge"), value: []byte("{"), kind: "dead_letter",
				headers: map[string][]byte{"x-huge": append(bytes.Repeat([]byte("h"), 600<<10), 0xff)}},
			record{shape: c.prefix + "-no-id-header", topic: c.topic, id: nil, key: []byte("hostile-no-id"), value: []byte(`{"x":1}`), kind: "invalid", reason: "no id"},
			record{shape: c.prefix + "-id-not-text", topic: c.topic, id: []byte("\xff\xfe\x00" + c.prefix), key: []byte("hostile-id"), value: nil,
				kind: "invalid", reason: "not valid UTF-8 text"},
		)
	}
	for i := range records {
		if records[i].storedID == "" && records[i].kind == "dead_letter" {
			records[i].storedID = string(records[i].id)
		}
	}

	conf := kafkaconf.Sarama()
	conf.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(b.sys.Kafka.Brokers(), conf)
	require.NoError(t, err)
	defer prod.Close()
	send := func(records []record) {
		for _, r := range records {
			m := &sarama.ProducerMessage{Topic: r.topic}
			if r.key != nil {
				m.Key = sarama.ByteEncoder(r.key)
			}
			if r.value != nil {
				m.Value = sarama.ByteEncoder(r.value)
			}
			if r.id != nil {
				m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(kafka.UUIDHeaderKey), Value: r.id})
			}
			for k, v := range r.headers {
				m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: v})
			}
			_, _, err := prod.SendMessage(m)
			if err != nil {
				t.Errorf("%s: %v", r.shape, err) // t.Errorf: send runs on another goroutine too
				return
			}
		}
	}
	send(records) // before the load: every genuine order comes after them on some partition
	// And again while the load runs, each under a new id: hostile records
	// among the genuine orders, not only ahead of them.
	during := make([]record, len(records))
	for i, r := range records {
		during[i] = r
		if r.id != nil && r.kind == "dead_letter" {
			during[i].id = []byte(uuid.Must(uuid.NewV7()).String())
			during[i].storedID = string(during[i].id)
		}
		if r.kind == "invalid" {
			// Its row is told apart by its payload: the same one would be
			// the first copy's row again.
			during[i].value = append(append([]byte(nil), r.value...), " (during)"...)
		}
	}
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		// Into the load: once inventory has applied some of its orders.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(2 * time.Minute)
		for n := 0; n < 20; <-tick.C {
			if time.Now().After(deadline) {
				t.Errorf("inventory applied %d messages in 2 minutes", n)
				return
			}
			if err := b.sys.Pools["inventory"].QueryRow(context.Background(),
				`SELECT count(*) FROM inbox_messages WHERE status = 'processed'`).Scan(&n); err != nil {
				t.Errorf("counting inventory's applied messages: %v", err)
				return
			}
		}
		send(during)
	}()
	report := b.run(t, 200, 0)
	<-sent
	records = append(records, during...)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	consumer := map[string]string{events.TopicOrders: "inventory", events.TopicInventory: "orders"}
	for _, r := range records {
		pool := b.sys.Pools[consumer[r.topic]]
		sum := sha256.Sum256(r.value)
		require.Eventually(t, func() bool {
			var n int
			var reason *string
			var null bool
			err := pool.QueryRow(ctx, `SELECT count(*), min(reason), bool_and(payload IS NULL) FROM inbox_quarantine
				WHERE message_id = $1 AND kind = $2 AND payload_sha256 = $3`, r.storedID, r.kind, sum[:]).Scan(&n, &reason, &null)
			require.NoError(t, err, r.shape)
			if n != 1 || reason == nil {
				return false
			}
			require.Contains(t, *reason, r.reason, r.shape)
			require.Equal(t, r.value == nil, null, "%s: payload NULL exactly when the record had no value", r.shape)
			return true
		}, 30*time.Second, 50*time.Millisecond, "%s: one %s row with a reason", r.shape, r.kind)
	}
	t.Logf("%d hostile records quarantined with their reasons; %d genuine orders settled", len(records), report.OrdersPaid)
}
