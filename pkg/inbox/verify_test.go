package inbox_test

import (
	"bytes"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
)

// TestVerifyRefusesForgeries: with Config.Verify, a message the producer
// did not sign is quarantined as invalid with the reason before the inbox
// looks its id up: a forgery under a fresh id is never applied, and an
// unsigned copy of an applied message's id is neither a duplicate nor a
// conflict (it never touches the inbox row). A signed message is applied.
// Without Verify (the control), the forgery under a fresh id is applied.
func TestVerifyRefusesForgeries(t *testing.T) {
	t.Parallel()
	producer := signature.Key{ID: "producer-1", Secret: bytes.Repeat([]byte{7}, 32)}
	v, err := signature.NewVerifier(signature.Trusted{Key: producer, Topics: []string{"t"}})
	require.NoError(t, err)
	verify := func(msg *message.Message) error { return v.Verify("t", "", msg) }

	for _, batch := range []int{1, 4} {
		in, b := setup(t, inbox.Config{Verify: verify, BatchSize: batch})
		mw := in.Middleware(b.handler.handle)
		deliverSigned := func(k signature.Key, id string, payload []byte) {
			msg := message.NewMessage(id, payload)
			signature.Sign(k, "t", "", msg)
			msg.SetContext(b.ctx)
			_, err := mw(msg)
			require.NoError(t, err)
		}
		genuine, forged, wrongSecret := newID(), newID(), newID()
		deliverSigned(producer, genuine, []byte(`{"amount":1}`))
		require.NoError(t, deliver(b.ctx, mw, forged, []byte(`{"amount":2}`)))                                                   // unsigned
		require.NoError(t, deliver(b.ctx, mw, genuine, []byte(`{"amount":1}`)))                                                  // an unsigned copy of the genuine id
		deliverSigned(signature.Key{ID: "producer-1", Secret: bytes.Repeat([]byte{8}, 32)}, wrongSecret, []byte(`{"amount":3}`)) // the key's id, another secret

		require.Equal(t, 1, b.handler.callsFor(genuine))
		require.Equal(t, 0, b.handler.callsFor(forged)+b.handler.callsFor(wrongSecret))
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Invalid}, b.events.outcomes(genuine))
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(forged))
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(wrongSecret))
		require.Equal(t, 0, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, genuine))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, forged))
		reasons := scalar[[]string](t, b, `SELECT array_agg(reason ORDER BY id) FROM inbox_quarantine WHERE kind = 'invalid'`)
		require.Len(t, reasons, 3, "batch size %d", batch)
		require.Contains(t, reasons[0], "not authenticated: signature invalid: the message is not signed")
		require.Contains(t, reasons[2], "does not match")
	}

	// The control: without Verify the forgery is applied.
	in, b := setup(t, inbox.Config{})
	forged := newID()
	require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), forged, []byte(`{"amount":2}`)))
	require.Equal(t, 1, b.handler.callsFor(forged))
}
