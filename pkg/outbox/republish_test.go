package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// TestRepublish: the rows of a topic published in a window (of one key, or
// every key) are counted by the dry run, marked unpublished by Republish,
// which records who asked and why, and left alone outside it: older,
// newer, unsent, another topic or another key. A republish without a
// window, a topic, or who and why is refused.
func TestRepublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t)
	adm := outboxadmin.New(pool)
	topic := uniqueName(t)
	publish := func(key, to string, ago string) string {
		t.Helper()
		msg := outbox.NewMessage(key, []byte(key+ago))
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.PublishTx(ctx, tx, to, msg) }))
		if ago != "" {
			_, err := pool.Exec(ctx, `UPDATE outbox_messages SET published_at = now() - $2::interval WHERE message_id = $1`, msg.UUID, ago)
			require.NoError(t, err)
		}
		return msg.UUID
	}
	old := publish("a", topic, "3 hours")
	inA := publish("a", topic, "90 minutes")
	inB := publish("b", topic, "80 minutes")
	publish("a", "elsewhere", "85 minutes")
	recent := publish("b", topic, "10 minutes")
	unsent := publish("b", topic, "")
	window := outboxadmin.RepublishFilter{Topic: topic, Since: time.Now().Add(-2 * time.Hour), Until: time.Now().Add(-time.Hour)}

	n, err := adm.CountRepublish(ctx, window)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	oneKey := window
	oneKey.Key = "b"
	n, err = adm.Republish(ctx, oneKey, "ana", "inventory's skipped range on partition 3")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	unpublished := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT message_id::text FROM outbox_messages WHERE published_at IS NULL ORDER BY id`)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	require.Equal(t, []string{inB, unsent}, unpublished(), "only b's row in the window, beside the one never sent")
	n, err = adm.Republish(ctx, window, "ana", "the whole window")
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "b's row is unsent now: a's alone")
	require.Equal(t, []string{inA, inB, unsent}, unpublished())
	require.NotContains(t, unpublished(), old)
	require.NotContains(t, unpublished(), recent)

	list, err := adm.ListRepublishes(ctx, 10)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, "the whole window", list[0].Why)
	require.Equal(t, "b", list[1].Key)
	require.EqualValues(t, 1, list[1].Rows)
	require.Equal(t, "ana", list[1].By)

	for _, bad := range []outboxadmin.RepublishFilter{{Since: window.Since, Until: window.Until}, {Topic: topic, Until: window.Until},
		{Topic: topic, Since: window.Until, Until: window.Since}} {
		_, err := adm.Republish(ctx, bad, "ana", "why")
		require.Error(t, err, "%+v", bad)
	}
	_, err = adm.Republish(ctx, window, "", "why")
	require.ErrorContains(t, err, "who asks and why")
}
