package provider

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A lost response: the capture is executed and committed, and the client
// gets no answer, only a closed connection (at once) or silence until its
// timeout (with a delay). A retry with the same key gets the stored
// response. This is the provider's side of the crash window "effect done,
// record not written": the caller cannot tell it from a request that never
// arrived, and only the retry with the same key is safe.
func TestLostResponse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		delay  time.Duration
		client *http.Client
	}{
		{"closed at once", 0, client},
		{"silent past the client's timeout", time.Minute,
			&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{LostResponseRate: 1, LostResponseDelay: tc.delay})
			lost := postWith(tc.client, b.url, "key-1", body1)
			require.Error(t, lost.err, "the client must get no response (got %d %s)", lost.status, lost.body)

			ledger := b.ledger()
			require.Len(t, ledger, 1, "the capture is in the ledger although its response was lost")
			require.Equal(t, "key-1", ledger[0].IdempotencyKey)
			require.Equal(t, StatusCaptured, ledger[0].Status)

			retry := post(b.url, "key-1", body1)
			require.NoError(t, retry.err)
			require.Equal(t, http.StatusOK, retry.status, string(retry.body))
			require.True(t, retry.replayed())
			require.Equal(t, ledger[0], retry.capture(t))
			require.Len(t, b.ledger(), 1)
		})
	}
}

// An injected 500 comes before anything is done: no capture, no key
// stored, and a retry with the same key (here on the provider restarted
// without faults) executes.
func TestInjectedFailureDoesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{FailRate: 1})
	r := post(b.url, "key-1", body1)
	require.Equal(t, http.StatusInternalServerError, r.status, string(r.body))
	require.Equal(t, "api_error", r.apiError(t).Type)
	require.Empty(t, b.ledger())
	require.Zero(t, b.keyRows())

	_, healthy := b.start(Config{})
	retry := post(healthy, "key-1", body1)
	require.Equal(t, http.StatusOK, retry.status, string(retry.body))
	require.False(t, retry.replayed(), "the failed request stored nothing to replay")
	require.Len(t, b.ledger(), 1)
}

// A declined card is a result like any other: 402 card_declined, recorded
// as a declined attempt, stored under the key and replayed.
func TestDeclinedIsRecordedAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DeclineAmount: 666})
	body := `{"amount": 1250, "currency": "eur", "reference": "order-1", "source": "tok_declined"}`
	first := post(b.url, "key-1", body)
	require.Equal(t, http.StatusPaymentRequired, first.status, string(first.body))
	e := first.apiError(t)
	require.Equal(t, "card_error", e.Type)
	require.Equal(t, "card_declined", e.Code)
	require.NotNil(t, e.Capture)
	require.Equal(t, StatusDeclined, e.Capture.Status)

	again := post(b.url, "key-1", body)
	require.Equal(t, http.StatusPaymentRequired, again.status)
	require.True(t, again.replayed())
	require.Equal(t, string(first.body), string(again.body))

	byAmount := post(b.url, "key-2", `{"amount": 666, "currency": "eur", "reference": "order-2", "source": "tok_visa"}`)
	require.Equal(t, http.StatusPaymentRequired, byAmount.status, string(byAmount.body))

	ledger := b.ledger()
	require.Len(t, ledger, 2)
	require.Equal(t, *e.Capture, ledger[0])
	require.Equal(t, "generic_decline", ledger[0].DeclineCode)
	var byRef List
	getJSON(t, b.url+"/v1/captures?reference=order-2", &byRef)
	require.Len(t, byRef.Data, 1)
	require.Equal(t, StatusDeclined, byRef.Data[0].Status)
}

// The same seed draws the same faults and latencies in the same order.
func TestSeedRepeatsFaults(t *testing.T) {
	t.Parallel()
	cfg := Config{Seed: 42, FailRate: 0.3, LostResponseRate: 0.3, LatencyMax: time.Second, KeyLockTimeout: time.Minute}
	a, err := New(nil, cfg)
	require.NoError(t, err)
	b, err := New(nil, cfg)
	require.NoError(t, err)
	var fails, losts int
	for range 200 {
		fa, fb := a.draw(), b.draw()
		require.Equal(t, fa, fb)
		if fa.fail {
			fails++
		}
		if fa.lost {
			losts++
		}
	}
	require.InDelta(t, 60, fails, 25)
	require.InDelta(t, 60, losts, 25)
	c, err := New(nil, Config{})
	require.NoError(t, err)
	require.NotZero(t, c.Seed(), "seed 0 picks one, to be logged")
}

// Go's http.Transport resends a request that carries an Idempotency-Key
// by itself when a reused keep-alive connection dies before the answer
// (Request.isReplayable), once, on a new connection. Against a lost
// response the caller then sees the replay, never the loss: whoever wires
// a Go client to this provider should know that its "lost response" can
// arrive as a 200 with Idempotent-Replayed: true.
func TestGoTransportRetriesALostResponseByItself(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{LostResponseRate: 1})
	keepAlive := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	resp, err := keepAlive.Get(b.url + "/healthz") // a connection to reuse
	require.NoError(t, err)
	readAll(t, resp)

	r := postWith(keepAlive, b.url, "key-1", body1)
	require.NoError(t, r.err, "the Transport hid the lost response")
	require.Equal(t, http.StatusOK, r.status)
	require.True(t, r.replayed(), "what the caller got is the replay of its own lost request")
	require.Len(t, b.ledger(), 1)

	// Without a key the request is not replayable: the loss reaches the caller.
	resp, err = keepAlive.Get(b.url + "/healthz")
	require.NoError(t, err)
	readAll(t, resp)
	require.Error(t, postWith(keepAlive, b.url, "", body1).err)
	require.Len(t, b.ledger(), 2)
}
