package effect_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// TestCallsOnceTheStandbyHolds: with Config.Standby, no call goes out for
// an effect until a streaming standby flushed it (its enqueue and its
// claim).
func TestCallsOnceTheStandbyHolds(t *testing.T) {
	pool := newPool(t)
	node := testPG.StartStandby(t, pool)
	gate, err := standby.New(standby.Config{Pool: pool, Slots: []string{node.Slot}})
	require.NoError(t, err)
	w := newWorld(true, nil)
	enqueue(t, pool, 1)
	start(t, effect.Config[string]{Pool: pool, Do: w.do, Standby: gate})

	for gate.Stats().Waiting == 0 {
		require.Zero(t, w.callCount(), "called before the claim waited for the standby")
	}
	for reads := gate.Stats().Reads; gate.Stats().Reads < reads+20; {
		require.Zero(t, w.callCount(), "called before the standby held the effect")
	}
	node.CatchUp()
	ended := waitEnded(t, pool)
	require.Len(t, ended, 1)
	require.Equal(t, 1, w.callCount())
}
