package signature_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
)

var (
	orders2025 = signature.Key{ID: "orders-2025", Secret: bytes.Repeat([]byte{1}, 32)}
	orders2026 = signature.Key{ID: "orders-2026", Secret: bytes.Repeat([]byte{2}, 32)}
	inventory  = signature.Key{ID: "inventory-1", Secret: bytes.Repeat([]byte{3}, 32)}
)

func signed(k signature.Key, topic, key, id, payload string) *message.Message {
	msg := message.NewMessage(id, []byte(payload))
	signature.Sign(k, topic, key, msg)
	return msg
}

// TestVerify: a message verifies only as it was signed: the same id, topic,
// key and payload, under a key the consumer trusts for that topic. Each
// refusal wraps ErrInvalid and says why.
func TestVerify(t *testing.T) {
	t.Parallel()
	v, err := signature.NewVerifier(
		signature.Trusted{Key: orders2025, Topics: []string{"orders.events"}},
		signature.Trusted{Key: orders2026, Topics: []string{"orders.events"}}, // a rotation's overlap
	)
	require.NoError(t, err)
	const topic, key, id, payload = "orders.events", "order-1", "0190a7c4-0000-7000-8000-000000000001", `{"a":1}`

	for _, k := range []signature.Key{orders2025, orders2026} {
		require.NoError(t, v.Verify(topic, key, signed(k, topic, key, id, payload)), "key %s", k.ID)
	}

	forged := func(edit func(*message.Message)) *message.Message {
		msg := signed(orders2026, topic, key, id, payload)
		edit(msg)
		return msg
	}
	numbered := func(edit func(*message.Message)) *message.Message {
		msg := message.NewMessage(id, []byte(payload))
		msg.Metadata.Set(signature.SequenceHeader, seqOf(7))
		signature.Sign(orders2026, topic, key, msg)
		edit(msg)
		return msg
	}
	cases := []struct {
		name, topic, key string
		msg              *message.Message
		reason           string
	}{
		{"Unsigned", topic, key, message.NewMessage(id, []byte(payload)), "not signed"},
		{"AnotherPayload", topic, key, forged(func(m *message.Message) { m.Payload = []byte(`{"a":2}`) }), "does not match"},
		{"AnotherID", topic, key, forged(func(m *message.Message) { m.UUID = "0190a7c4-0000-7000-8000-000000000002" }), "does not match"},
		{"AnotherKey", topic, "order-2", signed(orders2026, topic, key, id, payload), "does not match"},
		{"AnotherTopicSignedAsThis", topic, key, signed(orders2026, "other.events", key, id, payload), "does not match"},
		// The same bytes split otherwise between key and payload.
		{"KeyAndPayloadShifted", topic, "order-1{", forged(func(m *message.Message) { m.Payload = []byte(`"a":1}`) }), "does not match"},
		{"UntrustedKey", topic, key, signed(inventory, topic, key, id, payload), `key "inventory-1", which this consumer does not trust`},
		{"KeyNotForTopic", "inventory.events", key, signed(orders2026, "inventory.events", key, id, payload), "may not sign for topic"},
		{"NoKeyID", topic, key, forged(func(m *message.Message) { delete(m.Metadata, signature.KeyIDHeader) }), "without a signature_key_id"},
		{"NotBase64", topic, key, forged(func(m *message.Message) { m.Metadata.Set(signature.Header, "!!") }), "not a base64url"},
		{"Truncated", topic, key, forged(func(m *message.Message) { m.Metadata.Set(signature.Header, m.Metadata.Get(signature.Header)[:20]) }), "not a base64url"},
		// The sequence number is signed where a message carries one:
		// altered or stripped, it fails like an altered payload.
		{"SequenceAltered", topic, key, numbered(func(m *message.Message) { m.Metadata.Set(signature.SequenceHeader, seqOf(8)) }), "does not match the message's sequence number"},
		{"SequenceStripped", topic, key, numbered(func(m *message.Message) { delete(m.Metadata, signature.SequenceHeader) }), "does not match the message's sequence number"},
		{"SequenceEmptied", topic, key, numbered(func(m *message.Message) { m.Metadata.Set(signature.SequenceHeader, "") }), "does not match the message's sequence number"},
		{"SequenceSignatureTampered", topic, key, numbered(func(m *message.Message) { m.Metadata.Set(signature.SequenceSignatureHeader, "AAAA") }), "does not match the message's sequence number"},
	}
	ok := numbered(func(*message.Message) {})
	require.NoError(t, v.Verify(topic, key, ok), "a numbered message as signed")
	require.Equal(t, seqOf(7), ok.Metadata.Get(signature.SequenceHeader), "its number kept")
	require.Equal(t, signed(orders2026, topic, key, id, payload).Metadata.Get(signature.Header), ok.Metadata.Get(signature.Header),
		"the signature a consumer that knows no numbers checks is the one it always was")
	// A number nobody signed (added to a signed message, or signed by a
	// relay that does not number, or its signature stripped with it) is
	// taken away: the message verifies unnumbered.
	for name, msg := range map[string]*message.Message{
		"SequenceAdded":             forged(func(m *message.Message) { m.Metadata.Set(signature.SequenceHeader, seqOf(7)) }),
		"SequenceSignatureStripped": numbered(func(m *message.Message) { delete(m.Metadata, signature.SequenceSignatureHeader) }),
	} {
		require.NoError(t, v.Verify(topic, key, msg), name)
		_, kept := msg.Metadata[signature.SequenceHeader]
		require.False(t, kept, "%s: an unsigned number was kept", name)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			err := v.Verify(c.topic, c.key, c.msg)
			require.ErrorIs(t, err, signature.ErrInvalid)
			require.ErrorContains(t, err, c.reason)
		})
	}
}

func seqOf(n int) string { return fmt.Sprintf("0190a7c4-0000-4000-8000-00000000000a:%d", n) }

// TestSequenceHeaderIsTheOutboxs: the header signed is the one the outbox
// numbers messages under (signature does not import outbox).
func TestSequenceHeaderIsTheOutboxs(t *testing.T) {
	require.Equal(t, outbox.SequenceMetadata, signature.SequenceHeader)
}

// TestRotation: the overlap ends when the old key leaves the verifier; what
// it signed is then refused, and the new key's messages still pass.
func TestRotation(t *testing.T) {
	t.Parallel()
	after, err := signature.NewVerifier(signature.Trusted{Key: orders2026, Topics: []string{"t"}})
	require.NoError(t, err)
	require.ErrorContains(t, after.Verify("t", "k", signed(orders2025, "t", "k", "id", "p")), "does not trust")
	require.NoError(t, after.Verify("t", "k", signed(orders2026, "t", "k", "id", "p")))
}

func TestKeysRefused(t *testing.T) {
	t.Parallel()
	for name, k := range map[string]signature.Trusted{
		"ShortSecret": {Key: signature.Key{ID: "k", Secret: make([]byte, 31)}, Topics: []string{"t"}},
		"EmptyID":     {Key: signature.Key{Secret: make([]byte, 32)}, Topics: []string{"t"}},
		"SpaceInID":   {Key: signature.Key{ID: "a b", Secret: make([]byte, 32)}, Topics: []string{"t"}},
		"NoTopics":    {Key: orders2025},
	} {
		_, err := signature.NewVerifier(k)
		require.Error(t, err, name)
	}
	_, err := signature.NewVerifier(signature.Trusted{Key: orders2025, Topics: []string{"t"}}, signature.Trusted{Key: orders2025, Topics: []string{"u"}})
	require.ErrorContains(t, err, "given twice")
}

type recordingPublisher struct{ got []*message.Message }

func (r *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	r.got = append(r.got, msgs...)
	return nil
}
func (r *recordingPublisher) Close() error { return nil }

// TestPublisherSigns: what the Publisher passes on verifies under the key
// its PartitionKey names, and a signature the message already carried (a
// dead letter copies its original's headers) is replaced.
func TestPublisherSigns(t *testing.T) {
	t.Parallel()
	next := &recordingPublisher{}
	pub, err := signature.NewPublisher(next, inventory, func(_ string, m *message.Message) (string, error) {
		return m.Metadata.Get("partition_key"), nil
	})
	require.NoError(t, err)
	msg := signed(orders2025, "orders.events", "order-1", "id-1", "p") // an original's headers, copied
	msg.Metadata.Set("partition_key", "order-1")
	require.NoError(t, pub.Publish("inventory.dlq", msg))

	v, err := signature.NewVerifier(signature.Trusted{Key: inventory, Topics: []string{"inventory.dlq"}})
	require.NoError(t, err)
	require.Len(t, next.got, 1)
	require.NoError(t, v.Verify("inventory.dlq", "order-1", next.got[0]))

	_, err = signature.NewPublisher(next, signature.Key{ID: "k"}, nil)
	require.Error(t, err)
	require.False(t, errors.Is(err, signature.ErrInvalid))
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	k, err := signature.ParseKey(signature.FormatKey(orders2025))
	require.NoError(t, err)
	require.Equal(t, orders2025, k)
	for _, bad := range []string{"", "no-colon", "id:!!!", "id:" + "c2hvcnQ", ":" + signature.FormatKey(orders2025)[len("orders-2025:"):]} {
		_, err := signature.ParseKey(bad)
		require.Error(t, err, "%q", bad)
	}
}
