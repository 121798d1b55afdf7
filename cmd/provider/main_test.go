package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// The binary as chaos/system would run it: built, started as an OS
// process with its environment, ready at /readyz, capturing, and stopped
// by SIGTERM with exit status 0.
func TestProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bins, err := procs.Build(ctx, dir, "./cmd/provider")
	require.NoError(t, err)
	pg.DropWhenDone(t, "provider_process")
	url, err := pg.CreateDatabase(ctx, "provider_process")
	require.NoError(t, err)
	addr, err := procs.FreeAddr()
	require.NoError(t, err)
	log := &syncWriter{}
	p := &procs.Proc{Service: "provider", Name: "provider", Bin: bins["provider"], Addr: addr, Log: log,
		Env: []string{"DATABASE_URL=", "PROVIDER_DATABASE_URL=" + url, "PROVIDER_SEED=7", "PROVIDER_LATENCY_MAX=5ms"}}
	require.NoError(t, p.Start())
	t.Cleanup(p.Kill)
	require.NoError(t, p.WaitReady(ctx), log.String())

	body := `{"amount": 1250, "currency": "eur", "reference": "order-1", "source": "tok_visa"}`
	for i := range 2 {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/captures", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set(provider.HeaderIdempotencyKey, "key-1")
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, i == 1, resp.Header.Get(provider.HeaderReplayed) == "true")
	}
	resp, err := http.Get("http://" + addr + "/v1/ledger")
	require.NoError(t, err)
	var ledger provider.List
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ledger))
	resp.Body.Close()
	require.Len(t, ledger.Data, 1)

	require.NoError(t, p.Stop(15*time.Second), "a SIGTERM must stop it cleanly")
	require.Contains(t, log.String(), "seed=7")
	require.Contains(t, log.String(), "msg=stopped")
}

// Without a database URL it refuses to start, saying which variable.
func TestRunNeedsADatabase(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("PROVIDER_DATABASE_URL", "")
	err := run(t.Context())
	require.ErrorContains(t, err, "PROVIDER_DATABASE_URL")
	t.Setenv("PROVIDER_DATABASE_URL", "postgres://x")
	t.Setenv("PROVIDER_FAIL_RATE", "1.5")
	require.ErrorContains(t, run(t.Context()), "PROVIDER_FAIL_RATE")
	t.Setenv("PROVIDER_FAIL_RATE", "lots")
	require.ErrorContains(t, run(t.Context()), "PROVIDER_FAIL_RATE")
}

// syncWriter is the process's log, read while it is written.
type syncWriter struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
