package outbox_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// TestRelayWaitsForTheStandby: with RelayConfig.Standby, a batch reaches
// the broker only once a streaming standby flushed its rows. Until then the
// relay publishes nothing, however often the gate looks.
func TestRelayWaitsForTheStandby(t *testing.T) {
	t.Parallel()
	_, bundle := setupRelay(t)
	standbyNode := testPG.StartStandby(t, bundle.pool)
	gate, err := standby.New(standby.Config{Pool: bundle.pool, Slots: []string{standbyNode.Slot}})
	require.NoError(t, err)
	var published atomic.Int64
	pub := countingPublisher{Publisher: bundle.pub, n: &published}
	relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, Standby: gate})

	msg := newKeyedMessage("k", 1)
	publishCommitted(t, bundle.pool, bundle.topic, msg)
	done := make(chan int, 1)
	go func() {
		n, err := relay.RelayOnce(t.Context())
		require.NoError(t, err)
		done <- n
	}()
	for reads := gate.Stats().Reads; gate.Stats().Reads < reads+20; {
		require.Zero(t, published.Load(), "published before the standby held the row")
		select {
		case n := <-done:
			t.Fatalf("the batch ended (%d published) before the standby held its rows", n)
		default:
		}
	}
	require.Zero(t, countRows(t, bundle.pool, "published_at IS NOT NULL"))

	standbyNode.CatchUp()
	require.Equal(t, 1, <-done)
	bundle.sink.WaitFor(t, []string{msg.UUID})
	require.Equal(t, int64(1), gate.Stats().Released)
}
