package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if pg, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "outboxctl tests:", err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck
	return m.Run()
}

// ctl runs outboxctl with args against the database at url.
func ctl(ctx context.Context, url string, args ...string) (string, error) {
	var out bytes.Buffer
	err := run(ctx, args, &out, func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	})
	return out.String(), err
}

// newDB returns a fresh, migrated producer's database: its URL and a pool.
func newDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url, err := pg.CreateDatabase(t.Context(), "outboxctl_"+strings.ToLower(watermill.NewShortUUID()))
	require.NoError(t, err)
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, outbox.Migrate(t.Context(), pool))
	return url, pool
}

func TestOutboxctl(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, pool := newDB(t)

	// Two parked rows as a relay leaves them, and a row of the first one's
	// key waiting behind it.
	var ids []int64
	for _, r := range []struct{ key, reason string }{
		{"order-1", "the broker refused it: message too large"},
		{"order-2", "message is 1048706 bytes as a Kafka record, over the relay's 1000000-byte MaxMessageBytes"},
	} {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `
			INSERT INTO outbox_messages (message_id, topic, partition_key, payload, parked_at, park_reason)
			VALUES (gen_random_uuid(), 'orders', $1, 'big', now(), $2) RETURNING id`, r.key, r.reason).Scan(&id))
		ids = append(ids, id)
	}
	_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload) VALUES (gen_random_uuid(), 'orders', 'order-1', 'next')`)
	require.NoError(t, err)
	id1, id2 := fmt.Sprint(ids[0]), fmt.Sprint(ids[1])

	out, err := ctl(ctx, url, "list")
	require.NoError(t, err)
	require.Contains(t, out, "WAITING")
	require.Contains(t, out, "message too large")
	require.Equal(t, 3, strings.Count(out, "\n"), "a header and two rows:\n%s", out)

	out, err = ctl(ctx, url, "show", id1)
	require.NoError(t, err)
	require.Contains(t, out, "order-1")
	require.Contains(t, out, "rows waiting behind it:  1")
	require.Contains(t, out, "3 bytes: big")

	_, err = ctl(ctx, url, "drop", "-by", "alice", id1)
	require.ErrorContains(t, err, "drop needs -why")
	out, err = ctl(ctx, url, "drop", "-by", "alice", "-why", "order cancelled by hand", id1)
	require.NoError(t, err)
	require.Contains(t, out, id1+" dropped by alice")
	var by string
	require.NoError(t, pool.QueryRow(ctx, `SELECT dropped_by FROM outbox_dropped WHERE id = $1`, ids[0]).Scan(&by))
	require.Equal(t, "alice", by)

	out, err = ctl(ctx, url, "retry", id2)
	require.NoError(t, err)
	require.Contains(t, out, id2+" unparked")
	_, err = ctl(ctx, url, "retry", id2)
	require.ErrorIs(t, err, outboxadmin.ErrNotParked)
	_, err = ctl(ctx, url, "show", id1)
	require.ErrorIs(t, err, outboxadmin.ErrNotParked)

	out, err = ctl(ctx, url, "list")
	require.NoError(t, err)
	require.Equal(t, "nothing parked\n", out)
}

func TestOutboxctlUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"show"}, "show needs one ID"},
		{[]string{"retry", "x"}, "is not a number"},
		{[]string{"list", "7"}, "list takes no arguments"},
		{[]string{"drop", "7"}, "drop needs -why"},
		{[]string{"list", "-nope"}, "flag provided but not defined"},
	} {
		_, err := ctl(t.Context(), "", tc.args...)
		require.ErrorContains(t, err, tc.want, "outboxctl %q", tc.args)
	}
	_, err := ctl(t.Context(), "", "list")
	require.ErrorContains(t, err, "DATABASE_URL is required")
}

// TestOutboxctlRepublish: republish counts the rows of a topic published in
// a window, refuses to send them without the count the dry run printed (or
// who and why), marks them unpublished with it, and republishes lists what
// was asked.
func TestOutboxctlRepublish(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url, pool := newDB(t)
	_, err := pool.Exec(ctx, `INSERT INTO outbox_messages (message_id, topic, partition_key, payload, published_at) VALUES
		(gen_random_uuid(), 'orders.events', 'order-1', 'a', '2026-11-30T10:05:00Z'),
		(gen_random_uuid(), 'orders.events', 'order-2', 'b', '2026-11-30T10:30:00Z'),
		(gen_random_uuid(), 'orders.events', 'order-3', 'c', '2026-11-30T11:30:00Z')`)
	require.NoError(t, err)
	window := []string{"republish", "-topic", "orders.events", "-since", "2026-11-30T10:00:00Z", "-until", "2026-11-30T11:00:00Z"}

	out, err := ctl(ctx, url, window...)
	require.NoError(t, err)
	require.Contains(t, out, "2 rows of orders.events published from 2026-11-30T10:00:00Z to 2026-11-30T11:00:00Z would be sent again")
	_, err = ctl(ctx, url, append(window, "-expect", "3", "-by", "ana", "-why", "inventory skipped them")...)
	require.ErrorContains(t, err, "2 rows match now, not the 3 expected")
	_, err = ctl(ctx, url, append(window, "-expect", "2", "-by", "ana")...)
	require.ErrorContains(t, err, "needs -why")
	out, err = ctl(ctx, url, append(window, "-expect", "2", "-by", "ana", "-why", "inventory skipped them")...)
	require.NoError(t, err)
	require.Contains(t, out, "2 rows of orders.events marked unpublished by ana")
	var unsent int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE published_at IS NULL`).Scan(&unsent))
	require.Equal(t, 2, unsent)
	out, err = ctl(ctx, url, "republishes")
	require.NoError(t, err)
	require.Regexp(t, `orders\.events\s+2026-11-30T10:00:00Z\s+2026-11-30T11:00:00Z\s+2\s+ana\s+inventory skipped them`, out)
}
