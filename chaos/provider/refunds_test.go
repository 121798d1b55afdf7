package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/services/runtime/httpserve"
)

// refund sends body to url's POST /v1/refunds with key ("" for none).
func refund(url, key, body string) response { return postPath(client, url+"/v1/refunds", key, body) }

func (r response) refund(t *testing.T) Refund {
	t.Helper()
	var rf Refund
	require.NoError(t, json.Unmarshal(r.body, &rf), string(r.body))
	return rf
}

// captured captures amount for reference without a key and returns the
// capture.
func (b *testBundle) captured(amount int64, reference string) Capture {
	b.t.Helper()
	r := post(b.url, "", fmt.Sprintf(`{"amount": %d, "currency": "eur", "reference": %q, "source": "tok_visa"}`, amount, reference))
	require.NoError(b.t, r.err)
	require.Equal(b.t, http.StatusOK, r.status, string(r.body))
	return r.capture(b.t)
}

// refunds lists GET /v1/refunds?<query>.
func (b *testBundle) refunds(query string) []Refund {
	b.t.Helper()
	var l RefundList
	getJSON(b.t, b.url+"/v1/refunds?"+query, &l)
	require.Equal(b.t, "list", l.Object)
	require.False(b.t, l.HasMore)
	return l.Data
}

// refundRows counts the rows of refunds, and refunded sums a capture's.
func (b *testBundle) refundRows() int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(b.t.Context(), `SELECT count(*) FROM refunds`).Scan(&n))
	return n
}

func (b *testBundle) refunded(capture string) int64 {
	b.t.Helper()
	var n int64
	require.NoError(b.t, b.pool.QueryRow(b.t.Context(), `SELECT coalesce(sum(amount), 0) FROM refunds WHERE capture_id = $1`, capture).Scan(&n))
	return n
}

// requireRefused checks an executed refusal: status, invalid_request_error,
// code and param.
func requireRefused(t *testing.T, r response, status int, code, param string) {
	t.Helper()
	require.NoError(t, r.err)
	require.Equal(t, status, r.status, string(r.body))
	e := r.apiError(t)
	require.Equal(t, "invalid_request_error", e.Type)
	require.Equal(t, code, e.Code, e.Message)
	require.Equal(t, param, e.Param)
}

// A refund under a key is made once: the retry with the key (the same
// parameters, spaced and ordered otherwise) gets the stored answer byte
// for byte, marked as a replay, and no second refund.
func TestRefundSameKeyRefundsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")

	first := refund(b.url, "refund-1", `{"capture": "`+c.ID+`", "reason": "requested_by_customer"}`)
	require.NoError(t, first.err)
	require.Equal(t, http.StatusOK, first.status, string(first.body))
	require.False(t, first.replayed())
	rf := first.refund(t)
	require.True(t, strings.HasPrefix(rf.ID, "re_"), rf.ID)
	require.Equal(t, Refund{ID: rf.ID, Object: "refund", Capture: c.ID, Amount: 1250, Currency: "eur", Reference: "order-1",
		Reason: "requested_by_customer", Status: RefundSucceeded, IdempotencyKey: "refund-1", Created: b.clock.Now().Unix()}, rf)

	second := refund(b.url, "refund-1", `{"reason":"requested_by_customer","capture":"`+c.ID+`"}`)
	require.NoError(t, second.err)
	require.Equal(t, http.StatusOK, second.status)
	require.True(t, second.replayed())
	require.Equal(t, string(first.body), string(second.body))
	require.Equal(t, first.header.Get(HeaderRequestID), second.header.Get(HeaderOriginalRequest))

	require.Equal(t, 1, b.refundRows())
	require.Equal(t, []Refund{rf}, b.refunds("capture="+c.ID))
	require.Equal(t, []Refund{rf}, b.refunds("reference=order-1"))
	var one Refund
	getJSON(t, b.url+"/v1/refunds/"+rf.ID, &one)
	require.Equal(t, rf, one)
	var linked string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT refund_id FROM idempotency_keys WHERE key = 'refund-1'`).Scan(&linked))
	require.Equal(t, rf.ID, linked)
}

// Once a capture is refunded in full, a refund under another key is
// refused (400 charge_already_refunded), and that answer too is stored
// under its key.
func TestRefundOfAFullyRefundedCaptureIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	require.Equal(t, http.StatusOK, refund(b.url, "refund-1", `{"capture": "`+c.ID+`"}`).status)

	again := refund(b.url, "refund-2", `{"capture": "`+c.ID+`"}`)
	requireRefused(t, again, http.StatusBadRequest, CodeChargeAlreadyRefunded, "capture")
	require.False(t, again.replayed())
	withAmount := refund(b.url, "refund-3", `{"capture": "`+c.ID+`", "amount": 1}`)
	requireRefused(t, withAmount, http.StatusBadRequest, CodeChargeAlreadyRefunded, "capture")

	replay := refund(b.url, "refund-2", `{"capture": "`+c.ID+`"}`)
	require.True(t, replay.replayed())
	require.Equal(t, string(again.body), string(replay.body))
	require.Equal(t, 1, b.refundRows())
	require.EqualValues(t, 1250, b.refunded(c.ID))
}

// A partial refund, then the rest (no amount: all that is left), then
// nothing is left.
func TestRefundPartialThenTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	other := b.captured(999, "order-2")

	part := refund(b.url, "refund-1", `{"capture": "`+c.ID+`", "amount": 500}`)
	require.Equal(t, http.StatusOK, part.status, string(part.body))
	require.EqualValues(t, 500, part.refund(t).Amount)
	rest := refund(b.url, "refund-2", `{"capture": "`+c.ID+`"}`)
	require.Equal(t, http.StatusOK, rest.status, string(rest.body))
	require.EqualValues(t, 750, rest.refund(t).Amount, "no amount: all that is left")
	requireRefused(t, refund(b.url, "refund-3", `{"capture": "`+c.ID+`"}`), http.StatusBadRequest, CodeChargeAlreadyRefunded, "capture")

	require.Equal(t, []Refund{part.refund(t), rest.refund(t)}, b.refunds("capture="+c.ID), "oldest first")
	require.Equal(t, []Refund{part.refund(t), rest.refund(t)}, b.refunds("reference=order-1"))
	require.Empty(t, b.refunds("capture="+other.ID), "another capture's refunds are its own")
	require.EqualValues(t, 1250, b.refunded(c.ID))
}

// An amount more than what is left is refused (400 amount_too_large), and
// refunds nothing; what is left can still be refunded.
func TestRefundAmountTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")

	requireRefused(t, refund(b.url, "refund-1", `{"capture": "`+c.ID+`", "amount": 1251}`), http.StatusBadRequest, CodeAmountTooLarge, "amount")
	require.Zero(t, b.refundRows())
	require.Equal(t, http.StatusOK, refund(b.url, "refund-2", `{"capture": "`+c.ID+`", "amount": 1000}`).status)
	requireRefused(t, refund(b.url, "refund-3", `{"capture": "`+c.ID+`", "amount": 251}`), http.StatusBadRequest, CodeAmountTooLarge, "amount")
	last := refund(b.url, "refund-4", `{"capture": "`+c.ID+`", "amount": 250}`)
	require.Equal(t, http.StatusOK, last.status, string(last.body))
	require.Equal(t, 2, b.refundRows())
	require.EqualValues(t, 1250, b.refunded(c.ID))
}

// A declined capture took no money: 400 capture_not_refundable.
func TestRefundOfADeclinedCaptureIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	declined := post(b.url, "", `{"amount": 1250, "currency": "eur", "reference": "order-1", "source": "tok_declined"}`)
	require.Equal(t, http.StatusPaymentRequired, declined.status, string(declined.body))
	c := declined.apiError(t).Capture
	require.NotNil(t, c)

	requireRefused(t, refund(b.url, "refund-1", `{"capture": "`+c.ID+`"}`), http.StatusBadRequest, CodeCaptureNotRefundable, "capture")
	requireRefused(t, refund(b.url, "", `{"capture": "`+c.ID+`", "amount": 1}`), http.StatusBadRequest, CodeCaptureNotRefundable, "capture")
	require.Zero(t, b.refundRows())
}

// An unknown capture is an executed answer like the others: 404
// resource_missing, stored under the key (no refund linked) and replayed.
func TestRefundOfAnUnknownCaptureIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	first := refund(b.url, "refund-1", `{"capture": "cap_nope"}`)
	requireRefused(t, first, http.StatusNotFound, CodeResourceMissing, "capture")
	require.False(t, first.replayed())

	again := refund(b.url, "refund-1", `{"capture": "cap_nope"}`)
	require.Equal(t, http.StatusNotFound, again.status)
	require.True(t, again.replayed())
	require.Equal(t, string(first.body), string(again.body))

	var state string
	var status int
	var refundID, captureID *string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT state, response_status, refund_id, capture_id FROM idempotency_keys WHERE key = 'refund-1'`).
		Scan(&state, &status, &refundID, &captureID))
	require.Equal(t, "done", state)
	require.Equal(t, http.StatusNotFound, status)
	require.Nil(t, refundID)
	require.Nil(t, captureID)
	require.Zero(t, b.refundRows())
}

// A refund whose response is lost was made; the retry with the same key
// gets it replayed, and there is one refund.
func TestRefundLostResponseThenRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	_, lossy := b.start(Config{LostResponseRate: 1})
	body := `{"capture": "` + c.ID + `", "amount": 300}`

	lost := refund(lossy, "refund-1", body)
	require.Error(t, lost.err, "the client must get no response (got %d %s)", lost.status, lost.body)
	made := b.refunds("capture=" + c.ID)
	require.Len(t, made, 1, "the refund is made although its response was lost")

	retry := refund(b.url, "refund-1", body)
	require.NoError(t, retry.err)
	require.Equal(t, http.StatusOK, retry.status, string(retry.body))
	require.True(t, retry.replayed())
	require.Equal(t, made[0], retry.refund(t))
	require.Equal(t, 1, b.refundRows())
	require.EqualValues(t, 300, b.refunded(c.ID))
}

// An injected 500 comes before anything is done: no refund, no key.
func TestRefundInjectedFailureDoesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	_, failing := b.start(Config{FailRate: 1})
	r := refund(failing, "refund-1", `{"capture": "`+c.ID+`"}`)
	require.Equal(t, http.StatusInternalServerError, r.status, string(r.body))
	require.Zero(t, b.refundRows())
	require.Zero(t, b.keyRows())
	retry := refund(b.url, "refund-1", `{"capture": "`+c.ID+`"}`)
	require.Equal(t, http.StatusOK, retry.status, string(retry.body))
	require.False(t, retry.replayed())
}

// The key reused with another body is refused with 422, stores nothing,
// and the original still replays; keys are global, so one used for a
// refund cannot capture.
func TestRefundKeyReusedWithAnotherBody(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	body := `{"capture": "` + c.ID + `", "amount": 100}`
	first := refund(b.url, "refund-1", body)
	require.Equal(t, http.StatusOK, first.status, string(first.body))

	for _, other := range []string{
		`{"capture": "` + c.ID + `", "amount": 200}`,
		`{"capture": "` + c.ID + `"}`,
		`{"capture": "` + c.ID + `", "amount": 100, "reason": "duplicate"}`,
		`{"capture": "cap_other", "amount": 100}`,
	} {
		r := refund(b.url, "refund-1", other)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, other)
		e := r.apiError(t)
		require.Equal(t, "idempotency_error", e.Type)
		require.Equal(t, "idempotency_key_mismatch", e.Code)
	}
	require.Equal(t, http.StatusUnprocessableEntity, post(b.url, "refund-1", body1).status, "a refund's key reused for a capture")

	again := refund(b.url, "refund-1", body)
	require.True(t, again.replayed())
	require.Equal(t, string(first.body), string(again.body))
	require.Equal(t, 1, b.refundRows())
	require.Len(t, b.ledger(), 1)
}

// Malformed refund requests get a 4xx with a reason, before anything is
// executed or stored under their key.
func TestRefundValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	capture := `"capture": "` + c.ID + `"`
	for _, tc := range []struct {
		name, body, contentType string
		status                  int
		param                   string
	}{
		{name: "not JSON", body: `capture=` + c.ID, status: 400},
		{name: "empty", body: ``, status: 400},
		{name: "array", body: `["` + c.ID + `"]`, status: 400},
		{name: "trailing data", body: `{` + capture + `} {}`, status: 400},
		{name: "unknown field", body: `{` + capture + `, "charge": "ch_1"}`, status: 400, param: "charge"},
		{name: "field in another case", body: `{"Capture": "` + c.ID + `"}`, status: 400, param: "Capture"},
		{name: "duplicate field", body: `{` + capture + `, "amount": 1, "amount": 1250}`, status: 400, param: "amount"},
		{name: "missing capture", body: `{"amount": 1}`, status: 400, param: "capture"},
		{name: "empty capture", body: `{"capture": ""}`, status: 400, param: "capture"},
		{name: "capture not text", body: `{"capture": 12}`, status: 400, param: "capture"},
		{name: "control character in capture", body: `{"capture": "cap_\u0000"}`, status: 400, param: "capture"},
		{name: "long capture", body: `{"capture": "` + strings.Repeat("c", 256) + `"}`, status: 400, param: "capture"},
		{name: "zero amount", body: `{` + capture + `, "amount": 0}`, status: 400, param: "amount"},
		{name: "negative amount", body: `{` + capture + `, "amount": -1}`, status: 400, param: "amount"},
		{name: "null amount", body: `{` + capture + `, "amount": null}`, status: 400, param: "amount"},
		{name: "fractional amount", body: `{` + capture + `, "amount": 12.5}`, status: 400, param: "amount"},
		{name: "string amount", body: `{` + capture + `, "amount": "100"}`, status: 400, param: "amount"},
		{name: "above the maximum", body: `{` + capture + `, "amount": 100000000}`, status: 400, param: "amount"},
		{name: "null reason", body: `{` + capture + `, "reason": null}`, status: 400, param: "reason"},
		{name: "long reason", body: `{` + capture + `, "reason": "` + strings.Repeat("r", MaxReasonBytes+1) + `"}`, status: 400, param: "reason"},
		{name: "control character in reason", body: `{` + capture + `, "reason": "a\nb"}`, status: 400, param: "reason"},
		{name: "invalid UTF-8", body: "{" + capture + ", \"reason\": \"\xff\"}", status: 400},
		{name: "oversize body", body: `{` + capture + `, "reason": "` + strings.Repeat("x", MaxBodyBytes) + `"}`, status: 413},
		{name: "form encoded", contentType: "application/x-www-form-urlencoded", body: `{` + capture + `}`, status: 415},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, b.url+"/v1/refunds", bytes.NewBufferString(tc.body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			req.Header.Set(HeaderIdempotencyKey, "key-"+tc.name)
			resp, err := client.Do(req)
			require.NoError(t, err)
			r := response{status: resp.StatusCode, header: resp.Header, body: readAll(t, resp)}
			require.Equal(t, tc.status, r.status, string(r.body))
			e := r.apiError(t)
			require.Equal(t, "invalid_request_error", e.Type)
			require.Empty(t, e.Code, "a malformed request is no executed refusal")
			require.Equal(t, tc.param, e.Param, e.Message)
			t.Log(e.Message)
		})
	}
	require.Zero(t, b.refundRows(), "a refused request refunded")
	require.Zero(t, b.keyRows(), "a refused request stored its key")

	// The longest reason is taken.
	long := refund(b.url, "", `{`+capture+`, "amount": 1, "reason": "`+strings.Repeat("r", MaxReasonBytes)+`"}`)
	require.Equal(t, http.StatusOK, long.status, string(long.body))
}

// Refunds of one capture under different keys at once never sum to more
// than the capture: the capture row's lock serializes them.
func TestConcurrentRefundsNeverExceedTheCapture(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	const n = 20
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]response, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = refund(b.url, fmt.Sprintf("refund-%d", i), `{"capture": "`+c.ID+`", "amount": 100}`)
		})
	}
	close(start)
	wg.Wait()
	var ok, tooLarge int
	for _, r := range results {
		require.NoError(t, r.err)
		switch r.status {
		case http.StatusOK:
			ok++
		case http.StatusBadRequest:
			require.Equal(t, CodeAmountTooLarge, r.apiError(t).Code)
			tooLarge++
		default:
			t.Fatalf("unexpected answer %d %s", r.status, r.body)
		}
	}
	require.Equal(t, 12, ok, "1250 holds twelve refunds of 100")
	require.Equal(t, 8, tooLarge)
	require.EqualValues(t, 1200, b.refunded(c.ID))
}

// GET /v1/refunds takes exactly one of capture and reference, as text;
// GET /v1/refunds/{id} answers 404 for none.
func TestRefundListingsRefuseBadQueries(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/v1/refunds", 400},
		{"/v1/refunds?capture=cap_1&reference=order-1", 400},
		{"/v1/refunds?capture=%FF%00", 400},
		{"/v1/refunds?reference=" + strings.Repeat("r", 256), 400},
		{"/v1/refunds/re_nope", 404},
		{"/v1/refunds/a%00b", 400},
	} {
		resp, err := client.Get(b.url + tc.path)
		require.NoError(t, err)
		body := readAll(t, resp)
		require.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.path, body)
	}
	require.Empty(t, b.refunds("capture=cap_nope"))
	require.Empty(t, b.refunds("reference=order-nope"))
}

// The token the provider's server requires of every POST (HTTP_TOKEN, as
// Run serves it) is required of POST /v1/refunds too; the listing is a read.
func TestRefundNeedsTheToken(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	c := b.captured(1250, "order-1")
	srv := httptest.NewServer(httpserve.Server("127.0.0.1:0", b.p.Handler(), httpserve.Options{Token: "s3cret"}).Handler)
	t.Cleanup(srv.Close)

	body := `{"capture": "` + c.ID + `"}`
	require.Equal(t, http.StatusUnauthorized, refund(srv.URL, "refund-1", body).status)
	require.Zero(t, b.refundRows())
	require.Zero(t, b.keyRows())

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/refunds", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(readAll(t, resp)))
	getJSON(t, srv.URL+"/v1/refunds?capture="+c.ID, &RefundList{})
}
