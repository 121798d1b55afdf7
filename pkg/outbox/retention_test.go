package outbox_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestRelayRetention: published rows go after Retention, unpublished ones never.
func TestRelayRetention(t *testing.T) {
	t.Parallel()

	t.Run("Retention", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletePublished", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setupRelay(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, Retention: time.Hour, RetentionBatch: 2,
			})

			// Log each DELETE statement's rows, oldest first, to see the batches.
			_, err := bundle.pool.Exec(ctx, `
				CREATE TABLE delete_log (stmt serial PRIMARY KEY, keys text[]);
				CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					INSERT INTO delete_log (keys)
					SELECT array_agg(partition_key ORDER BY published_at) FROM old_rows;
					RETURN NULL;
				END $$;
				CREATE TRIGGER log_delete AFTER DELETE ON outbox_messages
				REFERENCING OLD TABLE AS old_rows
				FOR EACH STATEMENT EXECUTE FUNCTION log_delete();`)
			require.NoError(t, err)

			// age: how long ago the row was published; "" for a pending row.
			rows := []struct{ key, age string }{
				{"old-5h", "5 hours"}, {"old-4h", "4 hours"}, {"old-3h", "3 hours"},
				{"old-2h", "2 hours"}, {"old-61m", "61 minutes"},
				{"recent-59m", "59 minutes"}, {"recent-1m", "1 minute"},
				{"pending", ""},
			}
			for _, r := range rows {
				publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage(r.key, nil))
				_, err := bundle.pool.Exec(ctx, `
					UPDATE outbox_messages
					SET created_at = now() - interval '6 hours',
					    published_at = now() - nullif($2, '')::interval
					WHERE partition_key = $1`, r.key, r.age)
				require.NoError(t, err)
			}

			deleted, err := relay.DeletePublished(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(5), deleted)
			require.Equal(t, int64(5), relay.Stats().Deleted)

			left, err := bundle.pool.Query(ctx, `SELECT partition_key FROM outbox_messages ORDER BY id`)
			require.NoError(t, err)
			leftKeys, err := pgx.CollectRows(left, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"recent-59m", "recent-1m", "pending"}, leftKeys)

			logged, err := bundle.pool.Query(ctx, `SELECT keys FROM delete_log WHERE keys IS NOT NULL ORDER BY stmt`)
			require.NoError(t, err)
			batches, err := pgx.CollectRows(logged, pgx.RowTo[[]string])
			require.NoError(t, err)
			require.Equal(t, [][]string{{"old-5h", "old-4h"}, {"old-3h", "old-2h"}, {"old-61m"}}, batches,
				"want batches of RetentionBatch rows, oldest first")

			deleted, err = relay.DeletePublished(ctx)
			require.NoError(t, err)
			require.Zero(t, deleted)
		})

		// A relay batch's rows share their published_at (the claim's
		// now()), so a deletion batch can end inside such a run: the next
		// one starts at that moment again, not after it.
		t.Run("DeletePublishedThroughTies", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setupRelay(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, Retention: time.Hour, RetentionBatch: 2,
			})
			insertPublished(t, bundle.pool, bundle.topic, 7, 2*time.Hour) // one batch's rows, published at one moment
			insertPublished(t, bundle.pool, bundle.topic, 2, time.Minute)
			deleted, err := relay.DeletePublished(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(7), deleted)
			require.Equal(t, 2, countRows(t, bundle.pool, "true"))
		})

		// A key's counter goes KeySequenceRetention after its last
		// message was written, unless a row of it waits to be sent; its
		// next message starts again at 1.
		t.Run("DeleteKeySequences", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setupRelay(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, KeySequenceRetention: time.Hour, RetentionBatch: 1,
			})
			for _, key := range []string{"rested", "rested-too", "rested-unsent", "recent"} {
				publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage(key, nil), outbox.NewMessage(key, nil))
			}
			// The key kept is the oldest: a batch must not end on it.
			_, err := bundle.pool.Exec(ctx, `UPDATE outbox_key_sequences SET touched_at = now() - interval '61 minutes' WHERE partition_key LIKE 'rested%';
				UPDATE outbox_key_sequences SET touched_at = now() - interval '62 minutes' WHERE partition_key = 'rested-unsent';
				UPDATE outbox_messages SET published_at = now() WHERE partition_key <> 'rested-unsent'`)
			require.NoError(t, err)
			deleted, err := relay.DeleteKeySequences(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(2), deleted, "a key with a row not sent yet keeps its counter")

			again := outbox.NewMessage("rested", nil)
			publishCommitted(t, bundle.pool, bundle.topic, again, outbox.NewMessage("recent", nil))
			var counters map[string]int64
			require.NoError(t, bundle.pool.QueryRow(ctx, `SELECT jsonb_object_agg(partition_key, seq) FROM outbox_key_sequences`).Scan(&counters))
			require.Equal(t, map[string]int64{"rested": 1, "rested-unsent": 2, "recent": 3}, counters)
		})

		t.Run("RunDeletes", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setupRelay(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, RetentionInterval: 20 * time.Millisecond,
			})
			startRelay(t, relay)

			msgs := []*message.Message{outbox.NewMessage("a", nil), outbox.NewMessage("b", nil), outbox.NewMessage("c", nil)}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 3 })
			require.Equal(t, 3, countRows(t, bundle.pool, "true"), "rows younger than Retention were deleted")

			_, err := bundle.pool.Exec(ctx, `UPDATE outbox_messages SET published_at = published_at - $1::interval`, (outbox.DefaultRetention + time.Hour).String())
			require.NoError(t, err)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Deleted == 3 }, "the retention job did not run")
			require.Zero(t, countRows(t, bundle.pool, "true"))
		})
	})
}
