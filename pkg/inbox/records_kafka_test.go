package inbox_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// rawRecord is a Kafka record as any client can write it: value nil is no
// value at all (a tombstone), key nil no key, id nil no message id header.
type rawRecord struct {
	shape   string
	id      []byte
	key     []byte
	value   []byte
	headers [][2][]byte
	// Where it must end: its quarantine row's kind, the reason's words, the
	// message id the row is stored under ("" for an id the inbox refuses).
	kind, reason, storedID string
	parkedUnderHold        bool // behind a held key: parked under HoldKey
}

const genuinePayload = `{"genuine":true}`

// hostileRecords returns one record of every shape the inbox can be handed:
// values that are not a payload, keys and headers no text column holds as
// they are, message ids missing or not text. A handler that refuses what it
// cannot decode dead-letters those it sees; the inbox quarantines the others
// as invalid before any handler runs.
func hostileRecords() []rawRecord {
	id := func() []byte { return []byte(uuid.NewString()) }
	dead := func(shape string, key, value []byte, headers ...[2][]byte) rawRecord {
		return rawRecord{shape: shape, id: id(), key: key, value: value, headers: headers, kind: "dead_letter", reason: "cannot decode"}
	}
	invalid := func(shape string, id, value []byte, reason string) rawRecord {
		return rawRecord{shape: shape, id: id, key: []byte("h-" + shape), value: value, kind: "invalid", reason: reason}
	}
	h := func(k, v string) [2][]byte { return [2][]byte{[]byte(k), []byte(v)} }
	rs := []rawRecord{
		dead("NoValue", []byte("h-tomb"), nil),
		dead("EmptyValue", []byte("h-empty"), []byte{}),
		dead("BinaryValue", []byte("h-binary"), []byte("\x00\xff\xfe{\"genuine\":true}\x00\xc3\x28")),
		dead("NotJSON", []byte("h-text"), []byte("hello")),
		dead("JSONWrongShape", []byte("h-shape"), []byte(`{"genuine":"yes","extra":[null]}`)),
		dead("NoKeyNoValue", nil, nil),
		dead("BinaryKey", []byte("h-\xff\x00\xfe"), []byte("{")),
		dead("LongKey", bytes.Repeat([]byte("k"), 64<<10), []byte("{")),
		dead("HeadersNotText", []byte("h-headers"), []byte("{"),
			h("x-nul", "a\x00b"), h("x-latin1", "caf\xe9"), h("x-\xff\x00", "name not text"), h("traceparent", "\x00garbage")),
		dead("HugeHeader", []byte("h-huge"), []byte("{"), h("x-huge", strings.Repeat("h", 600<<10)+"\xff")),
		// Its refusal quotes 300 kB of \xff as \\xff: a reason over a
		// record's limit.
		dead("RefusalOverARecord", []byte("h-quoted"), bytes.Repeat([]byte{0xff}, 300<<10)),
		dead("LongKeyHeader", []byte("h-keyheader"), []byte("{"), h(outbox.KeyMetadata, strings.Repeat("\xff", 10<<10))),
		invalid("NoIDHeader", nil, []byte("no id"), "message has no id"),
		invalid("EmptyID", []byte{}, []byte("empty id"), "message has no id"),
		invalid("IDNotUTF8", []byte("\xff\xfe"), []byte("id not utf-8"), "not valid UTF-8"),
		invalid("IDWithNUL", []byte("abc\x00def"), nil, "not valid UTF-8"),
		invalid("LongID", bytes.Repeat([]byte("i"), 2000), []byte("long id"), "exceeds the 1024-byte limit"),
	}
	// A record behind the first one's key, on its partition (produceRaw):
	// SkipKey dead-letters it like the first, HoldKey parks it, its payload
	// NULL as it arrived. On another partition it raced the first one's
	// dead letter, and was sometimes tried before the key was held.
	behind := dead("BehindTheTombstone", []byte("h-tomb"), nil)
	behind.parkedUnderHold = true
	rs = append(rs, behind)
	for i := range rs {
		if rs[i].kind == "dead_letter" {
			rs[i].storedID = string(rs[i].id)
		}
	}
	return rs
}

// TestHostileRecordsThroughKafka writes records of every shape with a raw
// Sarama producer (no value, binary keys and headers, ids that are not
// text: what no Watermill publisher writes), each followed on its partition
// by a genuine message on a key of its own, and consumes them through
// watermill-kafka's subscriber and the inbox: per message (Middleware) and
// in batches (Handler, BatchSize 4, three partitions delivered at once),
// under SkipKey and HoldKey (keyed by the Kafka record's key). Every genuine
// message must be applied, every offset committed (no partition blocked),
// and every hostile record quarantined with its reason, as it arrived: a
// NULL payload exactly when it had no value, its headers exactly in
// raw_metadata when they are not text; under HoldKey the record behind the
// tombstone's key is parked, its payload NULL. A refusal that quotes the
// record's bytes (NUL, invalid UTF-8) is stored as text all the same.
func TestHostileRecordsThroughKafka(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 4} {
		for _, policy := range []inbox.DeadLetterPolicy{inbox.SkipKey, inbox.HoldKey} {
			t.Run(fmt.Sprintf("BatchSize%d/Policy%d", batch, policy), func(t *testing.T) {
				t.Parallel()
				in, b := setup(t, inbox.Config{BatchSize: batch, OnDeadLetter: policy, Key: inboxkafka.Key, Position: inboxkafka.Position,
					MaxAttempts: 2, RetryBackoff: time.Millisecond})
				// The refusal quotes what it could not decode, bytes and all,
				// as a careless handler does; the first attempt fails as a
				// retryable error (inbox_attempts.last_error), the second
				// dead-letters it.
				refuse := func(msg *message.Message) error {
					if string(msg.Payload) == genuinePayload {
						return nil
					}
					return fmt.Errorf("cannot decode %s, that is %q (headers %v)", msg.Payload, msg.Payload, map[string]string(msg.Metadata))
				}
				topic := "inbox-hostile-" + watermill.NewShortUUID()
				require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic))
				if batch == 1 {
					b.handler.hook = func(msg *message.Message, _ int) error { return refuse(msg) }
					consumeRaw(t, b, topic, func(msg *message.Message) error { _, err := in.Middleware(b.handler.handle)(msg); return err })
				} else {
					consumeRaw(t, b, topic, in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
						for _, msg := range msgs {
							if _, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, 1)`, consumer, msg.UUID); err != nil {
								return err
							}
							if err := refuse(msg); err != nil {
								return err
							}
						}
						return nil
					}))
				}

				hostile := hostileRecords()
				var genuine []string
				var sent []rawRecord
				for _, r := range hostile {
					g := uuid.NewString()
					genuine = append(genuine, g)
					sent = append(sent, r, rawRecord{shape: "genuine", id: []byte(g), key: []byte("g-" + g), value: []byte(genuinePayload)})
				}
				produceRaw(t, topic, sent)
				t.Cleanup(func() {
					if !t.Failed() {
						return
					}
					// What stalled: the hostile records whose genuine follower
					// was never applied, and the last error each delivery met.
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					for i, g := range genuine {
						var n int
						_ = b.pool.QueryRow(ctx, `SELECT count(*) FROM applied WHERE message_id = $1`, g).Scan(&n)
						if n == 0 {
							t.Logf("not applied: the genuine message after %s", hostile[i].shape)
						}
					}
					for _, e := range b.events.all() {
						if e.Outcome == inbox.Retried {
							t.Logf("retried %.60q: %.200s", e.MessageID, e.Reason)
						}
					}
				})

				eventually(t, func() bool {
					return scalar[int](t, b, `SELECT count(*) FROM applied WHERE message_id = ANY($1)`, genuine) == len(genuine)
				}, 25*time.Second, "every genuine message applied", b.events.count)
				admin, err := sarama.NewClusterAdmin(kfk.Brokers(), kafkatest.Sarama())
				require.NoError(t, err)
				defer admin.Close()
				committed := func() int64 { return committedOffsets(t, admin, topic, topic) }
				eventually(t, func() bool { return committed() == int64(len(sent)) },
					20*time.Second, "every record acknowledged: no partition blocked", committed)

				for _, r := range hostile {
					sum := sha256.Sum256(r.value)
					if r.parkedUnderHold && policy == inbox.HoldKey {
						require.True(t, scalar[bool](t, b, `SELECT payload IS NULL FROM inbox_parked WHERE message_id = $1`, string(r.id)), r.shape)
						require.Equal(t, []inbox.Outcome{inbox.Parked}, b.events.outcomes(string(r.id)), r.shape)
						continue
					}
					var n int
					var reason string
					var null bool
					var raw map[string]string
					require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*), coalesce(min(reason), ''), bool_and(payload IS NULL),
							(array_agg(coalesce(raw_metadata, '{}')))[1]
						FROM inbox_quarantine WHERE message_id = $1 AND kind = $2 AND payload_sha256 = $3`,
						r.storedID, r.kind, sum[:]).Scan(&n, &reason, &null, &raw), r.shape)
					require.Equal(t, 1, n, "%s: one %s row", r.shape, r.kind)
					require.Contains(t, reason, r.reason, r.shape)
					require.Equal(t, r.value == nil, null, "%s: payload NULL exactly when the record had no value", r.shape)
					for _, kv := range r.headers { // each has a header that is not text
						require.Equal(t, base64.StdEncoding.EncodeToString(kv[1]), raw[base64.StdEncoding.EncodeToString(kv[0])],
							"%s: header %q kept as it arrived", r.shape, kv[0])
					}
					if r.kind == "dead_letter" {
						require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM outbox_messages WHERE topic = $1
							AND metadata->>'dead_letter_message_id' = $2 AND octet_length(metadata->>'dead_letter_reason') < 4200`,
							consumer+".dlq", r.storedID), "%s: its dead letter published, its reason clipped", r.shape)
					}
				}
			})
		}
	}
}

// produceRaw writes rs in order with a Sarama producer, round robin over
// topic's three partitions a pair at a time, so each record is followed on
// its partition by the one after it; a key's later records go to the
// partition of its first, as Kafka's partitioner puts them.
func produceRaw(t *testing.T, topic string, rs []rawRecord) {
	t.Helper()
	conf := kafkatest.Sarama()
	conf.Producer.Partitioner = sarama.NewManualPartitioner
	conf.Producer.MaxMessageBytes = 2 << 20
	prod, err := sarama.NewSyncProducer(kfk.Brokers(), conf)
	require.NoError(t, err)
	defer prod.Close()
	partitionOf := map[string]int32{} // a key's records on one partition, as Kafka's partitioner puts them
	for i, r := range rs {
		m := &sarama.ProducerMessage{Topic: topic, Partition: int32(i/2) % 3}
		if r.key != nil {
			m.Key = sarama.ByteEncoder(r.key)
			if p, ok := partitionOf[string(r.key)]; ok {
				m.Partition = p
			}
			partitionOf[string(r.key)] = m.Partition
		}
		if r.value != nil {
			m.Value = sarama.ByteEncoder(r.value)
		}
		if r.id != nil {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(kafka.UUIDHeaderKey), Value: r.id})
		}
		for _, kv := range r.headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: kv[0], Value: kv[1]})
		}
		_, _, err := prod.SendMessage(m)
		require.NoError(t, err, r.shape)
	}
}

// consumeRaw runs a Watermill router that consumes topic (its group named
// after it) with watermill-kafka's subscriber into h until the test ends.
func consumeRaw(t *testing.T, b *testBundle, topic string, h message.NoPublishHandlerFunc) {
	t.Helper()
	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if testing.Verbose() {
		logger = watermill.NewStdLogger(false, false)
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: kfk.Brokers(), Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: kafkatest.Sarama(), ConsumerGroup: topic,
	}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	router.AddConsumerHandler("apply", topic, sub, h)
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-runErr)
	})
	select {
	case <-router.Running():
	case <-b.ctx.Done():
		t.Fatal("router did not start")
	}
}
