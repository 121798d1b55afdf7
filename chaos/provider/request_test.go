package provider

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Malformed and hostile requests are refused with a 4xx and a reason,
// before anything is executed or stored under their key.
func TestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tc := range []struct {
		name, key, body, contentType string
		status                       int
		param                        string
	}{
		{name: "not JSON", body: `amount=1250`, status: 400},
		{name: "array", body: `[1250]`, status: 400},
		{name: "empty", body: ``, status: 400},
		{name: "null", body: `null`, status: 400},
		{name: "truncated", body: `{"amount": 1250, "currency": "eur"`, status: 400},
		{name: "trailing data", body: body1 + `{}`, status: 400},
		{name: "unknown field", body: `{"amount": 1250, "currency": "eur", "reference": "o", "source": "tok_visa", "capture_method": "manual"}`, status: 400, param: "capture_method"},
		{name: "field in another case", body: `{"Amount": 1250, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "Amount"},
		{name: "unpaired surrogate", body: `{"amount": 1250, "currency": "eur", "reference": "o\ud800", "source": "tok_visa"}`, status: 400, param: "reference"},
		{name: "nested duplicate-free but null", body: `{"amount": null, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "duplicate field", body: `{"amount": 1, "amount": 99999, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "missing amount", body: `{"currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "zero amount", body: `{"amount": 0, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "negative amount", body: `{"amount": -5, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "fractional amount", body: `{"amount": 12.5, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "exponent amount", body: `{"amount": 1e3, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "string amount", body: `{"amount": "1250", "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "int64 overflow", body: `{"amount": 9223372036854775808, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "above the maximum", body: `{"amount": 100000000, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "null amount", body: `{"amount": null, "currency": "eur", "reference": "o", "source": "tok_visa"}`, status: 400, param: "amount"},
		{name: "unknown currency", body: `{"amount": 1, "currency": "xxx", "reference": "o", "source": "tok_visa"}`, status: 400, param: "currency"},
		{name: "uppercase currency", body: `{"amount": 1, "currency": "EUR", "reference": "o", "source": "tok_visa"}`, status: 400, param: "currency"},
		{name: "missing reference", body: `{"amount": 1, "currency": "eur", "source": "tok_visa"}`, status: 400, param: "reference"},
		{name: "long reference", body: `{"amount": 1, "currency": "eur", "reference": "` + strings.Repeat("r", 256) + `", "source": "tok_visa"}`, status: 400, param: "reference"},
		{name: "control character in reference", body: `{"amount": 1, "currency": "eur", "reference": "o\u0000", "source": "tok_visa"}`, status: 400, param: "reference"},
		{name: "invalid UTF-8", body: "{\"amount\": 1, \"currency\": \"eur\", \"reference\": \"o\xff\", \"source\": \"tok_visa\"}", status: 400},
		{name: "missing source", body: `{"amount": 1, "currency": "eur", "reference": "o"}`, status: 400, param: "source"},
		{name: "source not a token", body: `{"amount": 1, "currency": "eur", "reference": "o", "source": "4242424242424242"}`, status: 400, param: "source"},
		{name: "oversize body", body: `{"amount": 1, "currency": "eur", "reference": "o", "source": "tok_visa", "pad": "` + strings.Repeat("x", MaxBodyBytes) + `"}`, status: 413},
		{name: "key too long", key: strings.Repeat("k", MaxKeyLength+1), body: body1, status: 400, param: HeaderIdempotencyKey},
		{name: "key not ASCII", key: "schlüssel", body: body1, status: 400, param: HeaderIdempotencyKey},
		{name: "form encoded", contentType: "application/x-www-form-urlencoded", body: body1, status: 415},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, b.url+"/v1/captures", bytes.NewBufferString(tc.body))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			if tc.key != "" {
				req.Header.Set(HeaderIdempotencyKey, tc.key)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			r := response{status: resp.StatusCode, header: resp.Header}
			r.body = readAll(t, resp)
			require.Equal(t, tc.status, r.status, string(r.body))
			e := r.apiError(t)
			require.Equal(t, "invalid_request_error", e.Type)
			require.NotEmpty(t, e.Message)
			require.Equal(t, tc.param, e.Param, e.Message)
			t.Log(e.Message)
		})
	}
	require.Empty(t, b.ledger(), "a refused request captured")
	require.Zero(t, b.keyRows(), "a refused request stored its key")

	// The longest key is taken, and the empty one is not.
	long := post(b.url, strings.Repeat("k", MaxKeyLength), body1)
	require.Equal(t, http.StatusOK, long.status, string(long.body))
	req, err := http.NewRequest(http.MethodPost, b.url+"/v1/captures", strings.NewReader(body1))
	require.NoError(t, err)
	req.Header[HeaderIdempotencyKey] = []string{""}
	resp, err := client.Do(req)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	req, err = http.NewRequest(http.MethodPost, b.url+"/v1/captures", strings.NewReader(body1))
	require.NoError(t, err)
	req.Header[HeaderIdempotencyKey] = []string{"a", "b"}
	resp, err = client.Do(req)
	require.NoError(t, err)
	readAll(t, resp)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "two keys")
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err := buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	return buf.Bytes()
}

// GET /v1/ledger pages through every attempt in order; its cursor and
// limit are checked.
func TestLedgerPages(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	var ids []string
	for range 5 {
		r := post(b.url, "", body1)
		require.Equal(t, http.StatusOK, r.status)
		ids = append(ids, r.capture(t).ID)
	}
	var got []string
	for _, c := range b.ledger() { // two a page
		got = append(got, c.ID)
	}
	require.Equal(t, ids, got)

	var one Capture
	getJSON(t, b.url+"/v1/captures/"+ids[2], &one)
	require.Equal(t, ids[2], one.ID)
	for _, bad := range []string{"/v1/ledger?limit=0", "/v1/ledger?limit=1001", "/v1/ledger?limit=x", "/v1/ledger?starting_after=cap_nope", "/v1/captures", "/v1/captures/cap_nope"} {
		resp, err := client.Get(b.url + bad)
		require.NoError(t, err)
		readAll(t, resp)
		require.Contains(t, []int{400, 404}, resp.StatusCode, bad)
	}
}
