package provider

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/procs"
)

// Run serves until its context ends, then stops at once and cleanly, also
// while a lost response is being held silent for a minute.
func TestRunShutsDownGracefully(t *testing.T) {
	t.Parallel()
	name := "provider_run_" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "_"))
	pg.DropWhenDone(t, name)
	url, err := pg.CreateDatabase(t.Context(), name)
	require.NoError(t, err)
	addr, err := procs.FreeAddr()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{DatabaseURL: url, HTTPAddr: addr, LostResponseRate: 1, LostResponseDelay: time.Minute,
			Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	}()
	base := "http://" + addr
	require.Eventually(t, func() bool {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond)

	lost := make(chan response, 1)
	go func() { lost <- post(base, "key-1", body1) }()
	require.Eventually(t, func() bool { // executed and committed, now silent
		var l List
		getJSON(t, base+"/v1/ledger", &l)
		return len(l.Data) == 1
	}, 10*time.Second, 20*time.Millisecond)

	stopped := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.Less(t, time.Since(stopped), 5*time.Second, "the shutdown waited out the lost response's silence")
	require.Error(t, (<-lost).err, "the lost response stays lost")
}
