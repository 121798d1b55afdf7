package inbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestMiddlewareQuarantines: what the inbox cannot deduplicate or must not
// apply (a payload conflict, no id, an id it cannot store or not in the
// issued format, an oversized payload) is quarantined with its reason, and
// the delivery acknowledged.
func TestMiddlewareQuarantines(t *testing.T) {
	t.Parallel()

	t.Run("PayloadConflictQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		id := newID()
		original, conflicting := []byte(`{"amount":100}`), []byte(`{"amount":999}`)

		require.NoError(t, deliver(b.ctx, mw, id, original))
		require.NoError(t, deliver(b.ctx, mw, id, conflicting))

		require.Equal(t, 1, b.handler.callsFor(id), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Conflict}, b.events.outcomes(id))
		require.Contains(t, b.events.last(t).Reason, fmt.Sprintf("%x", sha(original)))
		var kind string
		var payloadSum, originalSum, stored []byte
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, payload_sha256, original_sha256, payload FROM inbox_quarantine
			WHERE consumer = $1 AND message_id = $2`, consumer, id).Scan(&kind, &payloadSum, &originalSum, &stored))
		require.Equal(t, "payload_conflict", kind)
		require.Equal(t, sha(conflicting), payloadSum)
		require.Equal(t, sha(original), originalSum)
		require.Equal(t, conflicting, stored)

		// The same conflicting payload again: settled as a conflict, recorded once.
		require.NoError(t, deliver(b.ctx, mw, id, conflicting))
		require.Equal(t, 1, b.handler.callsFor(id))
		require.Equal(t, inbox.Conflict, b.events.last(t).Outcome)
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT duplicates FROM inbox_messages WHERE message_id = $1`, id), "a conflict is no duplicate")
		require.Equal(t, 1, appliedRows(t, b, consumer, id))
	})

	t.Run("MissingIDQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})

		require.NoError(t, deliver(b.ctx, in.Middleware(b.handler.handle), "", []byte(`{"amount":100}`)), "an invalid message is acknowledged")

		require.Equal(t, 0, b.handler.callsFor(""), "handler runs")
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(""))
		var kind, reason string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, reason FROM inbox_quarantine WHERE consumer = $1`, consumer).Scan(&kind, &reason))
		require.Equal(t, "invalid", kind)
		require.Contains(t, reason, "no id")
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM applied`))
	})

	t.Run("OversizedPayloadQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxPayloadBytes: 8})
		mw := in.Middleware(b.handler.handle)
		fits, tooBig := newID(), newID()

		require.NoError(t, deliver(b.ctx, mw, fits, []byte("12345678")))
		require.NoError(t, deliver(b.ctx, mw, tooBig, []byte("123456789")))

		require.Equal(t, []inbox.Outcome{inbox.Applied}, b.events.outcomes(fits), "a payload of exactly the limit")
		require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(tooBig))
		require.Equal(t, 0, b.handler.callsFor(tooBig), "handler runs")
		var kind, reason string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT kind, reason FROM inbox_quarantine WHERE message_id = $1`, tooBig).Scan(&kind, &reason))
		require.Equal(t, "invalid", kind)
		require.Contains(t, reason, "8-byte limit")
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages WHERE message_id = $1`, tooBig))

		// Redelivered: quarantined once.
		require.NoError(t, deliver(b.ctx, mw, tooBig, []byte("123456789")))
		require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine`))
	})

	// Ids the inbox's indexes cannot hold are quarantined, not handed back to
	// the broker, which would redeliver them forever.
	t.Run("UnstorableIDQuarantined", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{})
		mw := in.Middleware(b.handler.handle)
		ids := map[string]string{
			"abc\x00def":                 "not valid UTF-8 text",
			"abc\xffdef":                 "not valid UTF-8 text",
			strings.Repeat(newID(), 100): "exceeds the 1024-byte limit", // 3.6 kB
		}
		for id, want := range ids {
			require.NoError(t, deliver(b.ctx, mw, id, []byte(id)), want)
			e := b.events.last(t)
			require.Equal(t, inbox.Invalid, e.Outcome, want)
			require.Contains(t, e.Reason, want)
			require.Equal(t, 0, b.handler.callsFor(id), want)
		}
		require.Equal(t, 3, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'invalid'`))
		require.Equal(t, 0, scalar[int](t, b, `SELECT count(*) FROM inbox_messages`))
	})

	// An id in another spelling of an applied message's UUID is a new key
	// to the inbox: without CheckID the copy is applied again.
	t.Run("IDNotInIssuedFormatQuarantined", func(t *testing.T) {
		t.Parallel()
		for _, check := range []bool{true, false} {
			cfg := inbox.Config{}
			if check {
				cfg.CheckID = inbox.CanonicalUUID
			}
			in, b := setup(t, cfg)
			mw := in.Middleware(b.handler.handle)
			id, payload := newID(), []byte(`{"amount":100}`)
			spellings := []string{strings.ToUpper(id), "{" + id + "}", "urn:uuid:" + id, strings.ReplaceAll(id, "-", "")}
			require.NoError(t, deliver(b.ctx, mw, id, payload))
			for _, other := range spellings {
				require.NoError(t, deliver(b.ctx, mw, other, payload))
			}
			applied := scalar[int](t, b, `SELECT count(*) FROM applied`)
			if !check {
				require.Equal(t, 1+len(spellings), applied, "the control: without CheckID every spelling is applied")
				continue
			}
			require.Equal(t, 1, applied, "only the issued spelling is applied")
			for _, other := range spellings {
				require.Equal(t, []inbox.Outcome{inbox.Invalid}, b.events.outcomes(other), other)
				require.Equal(t, 1, scalar[int](t, b, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'invalid' AND message_id = $1 AND reason LIKE '%not in the issued format%'`, other), other)
			}
			require.NoError(t, inbox.CanonicalUUID(id))
		}
	})

	// A handler error or a header holding what Postgres text cannot (a NUL
	// byte, invalid UTF-8) is still recorded: the message is retried and
	// dead-lettered like any other.
	t.Run("UnstorableTextStillDeadLetters", func(t *testing.T) {
		t.Parallel()
		in, b := setup(t, inbox.Config{MaxAttempts: 2, RetryBackoff: time.Millisecond})
		b.handler.hook = func(*message.Message, int) error { return errors.New("bad byte \x00 and \xff in field") }
		id := newID()
		msg := message.NewMessage(id, []byte(`{}`))
		msg.Metadata.Set("note", "a\x00b")
		msg.SetContext(b.ctx)

		_, err := in.Middleware(b.handler.handle)(msg)
		require.NoError(t, err)

		require.Equal(t, []inbox.Outcome{inbox.Retried, inbox.DeadLettered}, b.events.outcomes(id))
		require.Equal(t, "bad byte \uFFFD and \uFFFD in field",
			scalar[string](t, b, `SELECT substring(reason from 'bad byte.*field') FROM inbox_quarantine WHERE message_id = $1`, id))
		require.Equal(t, "a\uFFFDb", scalar[string](t, b, `SELECT metadata->>'note' FROM inbox_quarantine WHERE message_id = $1`, id))
		require.Equal(t, "a\uFFFDb", scalar[string](t, b, `SELECT metadata->>'note' FROM outbox_messages WHERE topic = $1`, consumer+".dlq"))
	})

}
