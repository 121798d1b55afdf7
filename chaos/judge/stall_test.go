package judge_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
)

// TestMeasureStall: the longest gap in publishing and in applying within
// the window, and when the last row committed before the primary came back
// was published; rows outside the window do not count.
func TestMeasureStall(t *testing.T) {
	ctx := t.Context()
	pool := serviceDatabase(t, ctx, "inventory")
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// Published at 0, 1, 2, then nothing until 23 (the failover), 24;
	// and one long before the window, which must not count.
	for _, pub := range []float64{-100, 0, 1, 2, 23, 24} {
		_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload, metadata, created_at, published_at)
			VALUES ($1, 't', 'k', '{}', '{}', $2, $3)`, uuid.NewString(), at(pub-0.5), at(pub))
		require.NoError(t, err)
	}
	// Committed at 20.5, before the primary was back at 21, published at 23.
	_, err := pool.Exec(ctx, `UPDATE outbox_messages SET created_at = $1 WHERE published_at = $2`, at(20.5), at(23))
	require.NoError(t, err)
	// Applied at 0, 5, then nothing until 26.
	for i, p := range []float64{0, 5, 26} {
		_, err := pool.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256, processed_at) VALUES ('inventory', $1, '\x00', $2)`,
			fmt.Sprint("i", i), at(p))
		require.NoError(t, err)
	}
	st, err := judge.MeasureStall(ctx, pool, at(-10), at(120), at(21))
	require.NoError(t, err)
	require.InDelta(t, 21.0, st.RelayS, 0.001, "published at 2, then at 23")
	require.InDelta(t, 21.0, st.ConsumerS, 0.001, "applied at 5, then at 26")
	require.InDelta(t, 2.0, st.DrainedS, 0.001, "the last row committed before 21 was published at 23")
}
