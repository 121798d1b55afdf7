package inbox_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestEveryRecordShapeSettles hands the inbox records of every shape a
// Kafka client can write (no value at all, an empty one, bytes that are not
// text, headers and keys no text column holds) behind a handler that refuses
// what it cannot decode, as a real one does: each ends dead-lettered with its
// reason, its quarantine row holds what arrived (NULL for no value, the raw
// headers when they are not text), and the genuine message after it is
// applied: nothing blocks the partition. A NOT NULL payload once failed the
// dead letter's insert for a record with no value, on every redelivery.
func TestEveryRecordShapeSettles(t *testing.T) {
	t.Parallel()
	type shape struct {
		name    string
		payload []byte
		headers map[string]string
	}
	shapes := []shape{
		{name: "NoValue", payload: nil},
		{name: "EmptyValue", payload: []byte{}},
		{name: "BinaryValue", payload: []byte("\x00\xff\xfe{\"a\":1}\x00\xc3\x28")},
		{name: "HeadersNotText", payload: []byte(`{"a":`), headers: map[string]string{"x-nul": "a\x00b", "x-latin1": "caf\xe9", "x-\xff\x00": "name"}},
		{name: "KeyNotText", payload: nil, headers: map[string]string{outbox.KeyMetadata: "k\xff\x00"}},
	}
	for _, batch := range []int{1, 4} {
		for _, policy := range []inbox.DeadLetterPolicy{inbox.SkipKey, inbox.HoldKey} {
			t.Run(fmt.Sprintf("BatchSize%d/Policy%d", batch, policy), func(t *testing.T) {
				t.Parallel()
				in, b := setup(t, inbox.Config{BatchSize: batch, OnDeadLetter: policy})
				b.handler.hook = func(msg *message.Message, _ int) error {
					if string(msg.Payload) != `{"genuine":true}` {
						return inbox.Permanent(errors.New("cannot decode"))
					}
					return nil
				}
				mw := in.Middleware(b.handler.handle)
				for _, s := range shapes {
					id, genuine := newID(), newID()
					msg := message.NewMessage(id, s.payload)
					msg.Metadata.Set(outbox.KeyMetadata, "key-"+s.name)
					for k, v := range s.headers {
						msg.Metadata.Set(k, v)
					}
					msg.SetContext(b.ctx)
					_, err := mw(msg)
					require.NoError(t, err, s.name)
					// The genuine message comes on another key: under HoldKey
					// the dead letter holds its own key only.
					require.NoError(t, deliver(b.ctx, mw, genuine, []byte(`{"genuine":true}`)), s.name)

					require.Equal(t, []inbox.Outcome{inbox.DeadLettered}, b.events.outcomes(id), s.name)
					require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(genuine), s.name)
					var null bool
					var stored []byte
					var reason string
					require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload IS NULL, coalesce(payload, ''), reason FROM inbox_quarantine
						WHERE message_id = $1 AND kind = 'dead_letter'`, id).Scan(&null, &stored, &reason), s.name)
					require.Equal(t, s.payload == nil, null, "%s: NULL exactly when the record had no value", s.name)
					require.Equal(t, string(s.payload), string(stored), s.name)
					require.Contains(t, reason, "cannot decode", s.name)
					raw := scalar[map[string]string](t, b, `SELECT coalesce(raw_metadata, '{}') FROM inbox_quarantine WHERE message_id = $1`, id)
					for k, v := range s.headers {
						require.Equal(t, base64.StdEncoding.EncodeToString([]byte(v)), raw[base64.StdEncoding.EncodeToString([]byte(k))],
							"%s: header %q kept as it arrived", s.name, k)
					}
				}
			})
		}
	}
}

// TestParkedRecordWithNoValue: under HoldKey, a record with no value behind
// a held key is parked as it arrived, its payload NULL (the NOT NULL column
// refused it, and the record came back forever).
func TestParkedRecordWithNoValue(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{OnDeadLetter: inbox.HoldKey})
	poison := newID()
	b.handler.hook = func(msg *message.Message, _ int) error {
		if msg.UUID == poison {
			return inbox.Permanent(errors.New("poison"))
		}
		return nil
	}
	mw := in.Middleware(b.handler.handle)
	send := func(id string, payload []byte) {
		msg := message.NewMessage(id, payload)
		msg.Metadata.Set(outbox.KeyMetadata, "k")
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
	}
	tomb := newID()
	send(poison, []byte(`{}`))
	send(tomb, nil)
	require.Equal(t, []inbox.Outcome{inbox.Parked}, b.events.outcomes(tomb))
	require.True(t, scalar[bool](t, b, `SELECT payload IS NULL FROM inbox_parked WHERE message_id = $1`, tomb))
	require.Equal(t, 0, b.handler.callsFor(tomb))
}
