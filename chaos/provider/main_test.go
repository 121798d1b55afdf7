package provider

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// testBundle is one provider on a database of its own, served by httptest.
type testBundle struct {
	t     *testing.T
	pool  *pgxpool.Pool
	clock *clock
	p     *Provider
	url   string
}

// setup starts a provider with cfg (its clock and logger filled in).
func setup(t *testing.T, cfg Config) *testBundle {
	t.Helper()
	pool := pg.TestDatabase(t)
	require.NoError(t, Migrate(t.Context(), pool))
	b := &testBundle{t: t, pool: pool, clock: &clock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}}
	b.p, b.url = b.start(cfg)
	return b
}

// start serves another provider with cfg on the bundle's database, as a
// restarted provider with other faults would.
func (b *testBundle) start(cfg Config) (*Provider, string) {
	b.t.Helper()
	cfg.Now = b.clock.Now
	cfg.Logger = slog.New(slog.NewTextHandler(b.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := New(b.pool, cfg)
	require.NoError(b.t, err)
	srv := httptest.NewServer(p.Handler())
	b.t.Cleanup(srv.Close)
	return p, srv.URL
}

// client sends each request on a new connection. Go's Transport retries a
// request that carries an Idempotency-Key by itself when a reused
// connection dies before the answer (Request.isReplayable), which would
// turn a lost response into a silent replay; the tests want to see both.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

type response struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r response) replayed() bool { return r.header.Get(HeaderReplayed) == "true" }

func (r response) capture(t *testing.T) Capture {
	t.Helper()
	var c Capture
	require.NoError(t, json.Unmarshal(r.body, &c), string(r.body))
	return c
}

func (r response) apiError(t *testing.T) APIError {
	t.Helper()
	var e ErrorBody
	require.NoError(t, json.Unmarshal(r.body, &e), string(r.body))
	return e.Error
}

// post sends body to url's POST /v1/captures with key ("" for none).
func post(url, key, body string) response { return postWith(client, url, key, body) }

func postWith(c *http.Client, url, key, body string) response {
	return postPath(c, url+"/v1/captures", key, body)
}

// postPath sends body to the POST endpoint at url with key ("" for none).
func postPath(c *http.Client, url, key, body string) response {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		return response{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(HeaderIdempotencyKey, key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// ledger reads the whole GET /v1/ledger, page by page.
func (b *testBundle) ledger() []Capture {
	b.t.Helper()
	var all []Capture
	after := ""
	for {
		url := b.url + "/v1/ledger?limit=2"
		if after != "" {
			url += "&starting_after=" + after
		}
		var page List
		getJSON(b.t, url, &page)
		all = append(all, page.Data...)
		if !page.HasMore {
			return all
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := client.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.NoError(t, json.Unmarshal(body, v))
}

// keyRows counts the rows of idempotency_keys.
func (b *testBundle) keyRows() int {
	b.t.Helper()
	var n int
	require.NoError(b.t, b.pool.QueryRow(b.t.Context(), `SELECT count(*) FROM idempotency_keys`).Scan(&n))
	return n
}

// clock is the provider's clock in tests: it moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

const body1 = `{"amount": 1250, "currency": "eur", "reference": "order-1", "source": "tok_visa"}`
