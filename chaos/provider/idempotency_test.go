package provider

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The same key and the same request: one capture; the second answer is
// the first's status and body byte for byte, marked as a replay. The
// second body differs in spacing and field order only: the fingerprint is
// of the parameters.
func TestSameKeySameBodyReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := post(b.url, "key-1", body1)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusOK, first.status, string(first.body))
	require.False(t, first.replayed())
	c := first.capture(t)
	require.Equal(t, Capture{ID: c.ID, Object: "capture", Amount: 1250, Currency: "eur", Reference: "order-1",
		Source: "tok_visa", Status: StatusCaptured, IdempotencyKey: "key-1", Created: b.clock.Now().Unix()}, c)

	second := post(b.url, "key-1", `{"source":"tok_visa","reference":"order-1","currency":"eur","amount":1250}`)
	require.NoError(t, second.err)
	require.Equal(t, first.status, second.status)
	require.Equal(t, string(first.body), string(second.body))
	require.True(t, second.replayed(), "a stored response carries %s: true", HeaderReplayed)
	require.Equal(t, first.header.Get(HeaderRequestID), second.header.Get(HeaderOriginalRequest))

	ledger := b.ledger()
	require.Len(t, ledger, 1)
	require.Equal(t, c, ledger[0])
}

// The same key with another amount: 422 idempotency_key_mismatch, no
// second capture, and the refusal is not stored: the original request
// still replays.
func TestSameKeyDifferentBodyIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := post(b.url, "key-1", body1)
	require.Equal(t, http.StatusOK, first.status, string(first.body))

	for _, other := range []string{
		`{"amount": 1251, "currency": "eur", "reference": "order-1", "source": "tok_visa"}`,
		`{"amount": 1250, "currency": "usd", "reference": "order-1", "source": "tok_visa"}`,
		`{"amount": 1250, "currency": "eur", "reference": "order-2", "source": "tok_visa"}`,
		`{"amount": 1250, "currency": "eur", "reference": "order-1", "source": "tok_mastercard"}`,
	} {
		r := post(b.url, "key-1", other)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, other)
		e := r.apiError(t)
		require.Equal(t, "idempotency_error", e.Type)
		require.Equal(t, "idempotency_key_mismatch", e.Code)
		require.False(t, r.replayed())
	}
	again := post(b.url, "key-1", body1)
	require.True(t, again.replayed())
	require.Equal(t, string(first.body), string(again.body))
	require.Len(t, b.ledger(), 1)
}

// Without a key every request is a new capture, as Stripe does.
func TestNoKeyCapturesEveryTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	r1, r2 := post(b.url, "", body1), post(b.url, "", body1)
	require.Equal(t, http.StatusOK, r1.status, string(r1.body))
	require.Equal(t, http.StatusOK, r2.status, string(r2.body))
	require.False(t, r2.replayed())
	require.NotEqual(t, r1.capture(t).ID, r2.capture(t).ID)
	ledger := b.ledger()
	require.Len(t, ledger, 2)
	require.Empty(t, ledger[0].IdempotencyKey)
	require.Zero(t, b.keyRows())
}

// Twenty requests with one key at once, while the first holds it for
// 300ms of latency: exactly one capture; each other request is told
// 409 idempotency_key_in_use (it arrived while the first executed) or gets
// the stored response (it arrived after).
func TestConcurrentSameKeyCapturesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LatencyMin: 300 * time.Millisecond, LatencyMax: 300 * time.Millisecond})
	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]response, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = post(b.url, "key-1", body1)
		})
	}
	close(start)
	wg.Wait()

	var executed, inUse, replayed int
	var stored string
	for _, r := range results {
		require.NoError(t, r.err)
		switch {
		case r.status == http.StatusOK && !r.replayed():
			executed++
			stored = string(r.body)
		case r.status == http.StatusOK:
			replayed++
		case r.status == http.StatusConflict:
			require.Equal(t, "idempotency_key_in_use", r.apiError(t).Code)
			inUse++
		default:
			t.Fatalf("unexpected answer %d %s", r.status, r.body)
		}
	}
	t.Logf("executed %d, in use %d, replayed %d", executed, inUse, replayed)
	require.Equal(t, 1, executed)
	require.Positive(t, inUse, "with 300ms of latency some requests must have met the key in progress")
	for _, r := range results {
		if r.replayed() {
			require.Equal(t, stored, string(r.body))
		}
	}
	require.Len(t, b.ledger(), 1)
	after := post(b.url, "key-1", body1)
	require.True(t, after.replayed())
	require.Equal(t, stored, string(after.body))
}

// A key whose holder died (a crash between claim and capture) is taken
// over after KeyLockTimeout; the old holder, should it be alive after all,
// cannot capture: completing needs the token the takeover replaced.
func TestStaleKeyIsTakenOverAndTheOldHolderFenced(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{KeyLockTimeout: time.Minute})
	ctx := t.Context()
	req, err := parseCaptureRequest([]byte(body1))
	require.NoError(t, err)
	fp := fingerprint(http.MethodPost, "/v1/captures", req)

	old, err := b.p.claimKey(ctx, "key-1", fp, "req_old", b.clock.Now())
	require.NoError(t, err)
	require.Equal(t, claimed, old.outcome)
	busy, err := b.p.claimKey(ctx, "key-1", fp, "req_new", b.clock.Now())
	require.NoError(t, err)
	require.Equal(t, inUse, busy.outcome)

	b.clock.Advance(time.Minute)
	taken, err := b.p.claimKey(ctx, "key-1", fp, "req_new", b.clock.Now())
	require.NoError(t, err)
	require.Equal(t, claimed, taken.outcome)

	_, _, _, err = b.p.execute(ctx, req, "key-1", old.token, "req_old")
	require.ErrorIs(t, err, errLostKey)
	require.Empty(t, b.ledger(), "the fenced holder captured")
	_, _, c, err := b.p.execute(ctx, req, "key-1", taken.token, "req_new")
	require.NoError(t, err)

	r := post(b.url, "key-1", body1)
	require.True(t, r.replayed())
	require.Equal(t, c.ID, r.capture(t).ID)
	require.Equal(t, "req_new", r.header.Get(HeaderOriginalRequest))
	require.Len(t, b.ledger(), 1)
}

// Keys live KeyTTL (24h): a day later the same key is a new request, and
// the sweep deletes what expired.
func TestKeysExpire(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := post(b.url, "key-1", body1)
	require.Equal(t, http.StatusOK, first.status)

	b.clock.Advance(DefaultKeyTTL - time.Second)
	require.True(t, post(b.url, "key-1", body1).replayed(), "a key is kept for 24h")
	n, err := b.p.Sweep(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)

	b.clock.Advance(time.Second)
	second := post(b.url, "key-1", body1)
	require.Equal(t, http.StatusOK, second.status)
	require.False(t, second.replayed(), "an expired key must be a new request")
	require.NotEqual(t, first.capture(t).ID, second.capture(t).ID)
	require.Len(t, b.ledger(), 2)

	// The first key is now a new one, of second; one more day and the
	// sweep takes it.
	b.clock.Advance(DefaultKeyTTL)
	n, err = b.p.Sweep(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Zero(t, b.keyRows())
	// Reused with another body after expiry: a new request, not a mismatch.
	third := post(b.url, "key-1", `{"amount": 99, "currency": "eur", "reference": "order-9", "source": "tok_visa"}`)
	require.Equal(t, http.StatusOK, third.status, string(third.body))
	require.False(t, third.replayed())
}
