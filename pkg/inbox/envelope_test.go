package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestEnvelopeRefusesWhatItsPayloadDenies: with Config.Envelope, a record
// whose partition key, topic, type header or id disagrees with what its
// payload says is quarantined as invalid with the disagreement as its
// reason, before any handler runs; through Kafka, per message and in
// batches. A record that agrees is applied, one without a type header too
// (absent is not a disagreement), and one whose payload the envelope
// reader cannot read reaches the handler (which refuses what it cannot
// read). Without Envelope (the control), every one is applied.
func TestEnvelopeRefusesWhatItsPayloadDenies(t *testing.T) {
	t.Parallel()
	type payload struct{ ID, Key, Type string }
	var topic string // per run; a "B" travels elsewhere
	envelope := func(msg *message.Message) (inbox.Envelope, bool) {
		var p payload
		if json.Unmarshal(msg.Payload, &p) != nil {
			return inbox.Envelope{}, false
		}
		topics := []string{topic}
		if p.Type == "B" {
			topics = []string{"elsewhere"}
		}
		return inbox.Envelope{Key: p.Key, Topics: topics, Type: p.Type, ID: p.ID}, true
	}
	type record struct {
		shape, key, typeHeader, reason string
		payload                        func(id string) payload // nil: not JSON
	}
	same := func(id string) payload { return payload{ID: id, Key: "k", Type: "A"} }
	records := []record{
		{shape: "Agrees", key: "k", typeHeader: "A", payload: same},
		{shape: "NoTypeHeader", key: "k", payload: same},
		{shape: "Unreadable", key: "k"},
		{shape: "KeyDisagrees", key: "other", typeHeader: "A", payload: same,
			reason: `the record disagrees with its payload: partition key "other", the payload's is "k"`},
		{shape: "TopicDisagrees", key: "k", typeHeader: "B", payload: func(id string) payload { return payload{ID: id, Key: "k", Type: "B"} },
			reason: `travels on ["elsewhere"]`},
		{shape: "TypeHeaderDisagrees", key: "k", typeHeader: "B", payload: same,
			reason: `the record disagrees with its payload: type header "B", the payload's type is "A"`},
		{shape: "IDDisagrees", key: "k", typeHeader: "A", payload: func(string) payload { return payload{ID: "another", Key: "k", Type: "A"} },
			reason: `the record disagrees with its payload: message id`},
	}

	for _, run := range []struct {
		name     string
		batch    int
		envelope func(*message.Message) (inbox.Envelope, bool)
	}{{"PerMessage", 1, envelope}, {"Batches", 4, envelope}, {"ControlWithoutEnvelope", 1, nil}} {
		t.Run(run.name, func(t *testing.T) {
			in, b := setup(t, inbox.Config{BatchSize: run.batch, Key: inboxkafka.Key, Envelope: run.envelope})
			topic = "inbox-envelope-" + watermill.NewShortUUID()
			require.NoError(t, kfk.CreateTopics(b.ctx, 3, topic)) // produceRaw writes round robin over three
			if run.batch == 1 {
				consumeRaw(t, b, topic, func(msg *message.Message) error { _, err := in.Middleware(b.handler.handle)(msg); return err })
			} else {
				consumeRaw(t, b, topic, in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
					for _, msg := range msgs {
						if _, err := tx.Exec(ctx, `INSERT INTO applied (consumer, message_id, n) VALUES ($1, $2, 1)`, consumer, msg.UUID); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			var sent []rawRecord
			ids := map[string]string{} // shape → message id
			for _, r := range records {
				id := uuid.NewString()
				ids[r.shape] = id
				value := []byte("{")
				if r.payload != nil {
					value, _ = json.Marshal(r.payload(id))
				}
				raw := rawRecord{shape: r.shape, id: []byte(id), key: []byte(r.key), value: value}
				if r.typeHeader != "" {
					raw.headers = [][2][]byte{{[]byte(outbox.TypeMetadata), []byte(r.typeHeader)}}
				}
				sent = append(sent, raw)
			}
			produceRaw(t, topic, sent)
			settled := func() int64 { return int64(len(b.events.all())) }
			eventually(t, func() bool { return settled() >= int64(len(records)) }, 20*time.Second, "every record settled", settled)

			for _, r := range records {
				id := ids[r.shape]
				if run.envelope == nil || r.reason == "" {
					require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM applied WHERE message_id = $1`, id), "%s: applied", r.shape)
					continue
				}
				require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM applied WHERE message_id = $1`, id), "%s: not applied", r.shape)
				require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(id), r.shape)
				reason := scalar[string](t, b, `SELECT reason FROM inbox_quarantine WHERE message_id = $1 AND kind = 'invalid'`, id)
				require.Contains(t, reason, r.reason, r.shape)
				if r.shape == "TopicDisagrees" {
					require.Contains(t, reason, fmt.Sprintf(`read from topic %q, its type "B" travels on`, topic))
				}
			}
		})
	}
}

// TestEnvelopeHandsOnWhatItRead: what Config.Envelope puts in the message's
// context (an event it decoded) reaches the handler, per message and in a
// batch, so a payload is decoded once (the services' events.DecodeMessage).
func TestEnvelopeHandsOnWhatItRead(t *testing.T) {
	t.Parallel()
	type decodedKey struct{}
	envelope := func(msg *message.Message) (inbox.Envelope, bool) {
		msg.SetContext(context.WithValue(msg.Context(), decodedKey{}, string(msg.Payload)))
		return inbox.Envelope{}, true
	}
	for _, batch := range []int{1, 4} {
		t.Run(fmt.Sprintf("BatchSize%d", batch), func(t *testing.T) {
			t.Parallel()
			in, b := setup(t, inbox.Config{BatchSize: batch, Envelope: envelope})
			var seen atomic.Int64
			h := in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
				for _, msg := range msgs {
					if got, _ := msg.Context().Value(decodedKey{}).(string); got != string(msg.Payload) {
						return inbox.Permanent(fmt.Errorf("the handler's message carries %q of its envelope, want %q", got, msg.Payload))
					}
					seen.Add(1)
				}
				return nil
			})
			mw := func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
			for i := range 3 {
				require.NoError(t, deliver(b.ctx, mw, newID(), []byte(fmt.Sprint("payload ", i))))
			}
			require.Equal(t, int64(3), seen.Load(), "outcomes: %v", b.events.all())
		})
	}
}
