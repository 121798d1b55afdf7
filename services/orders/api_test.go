package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// TestOrderBodiesReadOneWay: bodies that encoding/json reads one way and a
// strict reader refuses (a key twice, a key in another case, null, a second
// value, an unpaired surrogate) get a 400 with the reason, and nothing is
// created. A lenient decoder created an order from each.
func TestOrderBodiesReadOneWay(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	mux := http.NewServeMux()
	routes(mux, platform.DB{Pool: pool}, platform.Config{APIBatchSize: 1, APIBatchWorkers: 1})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	line := `[{"sku":"sku-01","quantity":1}]`
	for name, c := range map[string]struct{ body, reason string }{
		"KeyTwice":          {`{"lines":` + line + `,"lines":[{"sku":"sku-02","quantity":9}]}`, "lines: the key appears twice"},
		"KeyInAnotherCase":  {`{"Lines":` + line + `}`, "Lines: unknown field"},
		"CardInAnotherCase": {`{"lines":` + line + `,"CARD":"tok_visa"}`, "CARD: unknown field"},
		"NullLines":         {`{"lines":null}`, "lines: null is not an array"},
		"SecondValue":       {`{"lines":` + line + `}{"lines":[]}`, "data after the JSON value"},
		"UnpairedSurrogate": {`{"lines":[{"sku":"sku-01\ud800","quantity":1}]}`, `unpaired UTF-16 surrogate`},
		"FloatQuantity":     {`{"lines":[{"sku":"sku-01","quantity":1.5}]}`, "lines[0].quantity: want an integer"},
		"NoBody":            {``, "no body"},
	} {
		resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(c.body))
		require.NoError(t, err, name)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", name, body)
		require.Contains(t, string(body), c.reason, name)
	}
	require.Zero(t, scalar[int](t, pool, `SELECT count(*) FROM orders`), "an order was created from a refused body")

	resp, err := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"lines":`+line+`}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the body they were made from")
}

// TestDatabaseOutageAnswers503: with its database out of reach, the API
// answers 503 with Retry-After, not 500: the request may be tried again
// shortly, and no bug is counted. A request the database refused for its
// content still gets its own answer (404 here).
func TestDatabaseOutageAnswers503(t *testing.T) {
	t.Parallel()
	// Nothing listens on a port just closed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	down, err := pgxpool.New(t.Context(), "postgres://orders@"+addr+"/orders?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(down.Close)

	for name, pool := range map[string]*pgxpool.Pool{"down": down, "up": newDB(t)} {
		mux := http.NewServeMux()
		routes(mux, platform.DB{Pool: pool}, platform.Config{APIBatchSize: 1, APIBatchWorkers: 1})
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		id := "0190f1a2-0000-7000-8000-000000000001" // no such order
		for _, req := range []struct{ method, path, body string }{
			{"POST", "/orders", `{"lines":[{"sku":"sku-01","quantity":1}]}`},
			{"POST", "/orders/" + id + "/pay", ``},
			{"GET", "/orders/" + id, ``},
			{"GET", "/orders", ``},
		} {
			r, err := http.NewRequest(req.method, srv.URL+req.path, strings.NewReader(req.body))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(r)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if name == "up" {
				require.Less(t, resp.StatusCode, 500, "%s %s with the database up: %s", req.method, req.path, body)
				continue
			}
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s %s: %s", req.method, req.path, body)
			require.Equal(t, "1", resp.Header.Get("Retry-After"), "%s %s", req.method, req.path)
			require.Contains(t, string(body), "the database is unavailable", "%s %s", req.method, req.path)
		}
	}
}
