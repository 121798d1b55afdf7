package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	// The pool is never used: pgxpool connects lazily.
	pool, err := pgxpool.New(context.Background(), pg.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	tests := []struct {
		name    string
		cfg     inbox.Config
		wantErr []string // substrings of the error; none: valid
	}{
		{"Defaults", inbox.Config{Pool: pool, Consumer: "c"}, nil},
		{"NoPool", inbox.Config{Consumer: "c"}, []string{"Config.Pool"}},
		{"NoConsumer", inbox.Config{Pool: pool}, []string{"Config.Consumer"}},
		{"NegativeMaxAttempts", inbox.Config{Pool: pool, Consumer: "c", MaxAttempts: -1}, []string{"Config.MaxAttempts"}},
		{"NegativeMaxPayloadBytes", inbox.Config{Pool: pool, Consumer: "c", MaxPayloadBytes: -1}, []string{"Config.MaxPayloadBytes"}},
		{"NegativeBatchLinger", inbox.Config{Pool: pool, Consumer: "c", BatchLinger: -time.Millisecond}, []string{"Config.BatchLinger"}},
		{"RetentionBelowDefaultHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: time.Hour},
			[]string{"Config.Retention", "Config.RedeliveryHorizon"}},
		{"RetentionBelowHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: 24 * time.Hour, RedeliveryHorizon: 48 * time.Hour},
			[]string{"Config.Retention", "Config.RedeliveryHorizon", "24h0m0s", "48h0m0s"}},
		{"RetentionEqualsHorizon", inbox.Config{Pool: pool, Consumer: "c", Retention: time.Hour, RedeliveryHorizon: time.Hour}, nil},
		{"NegativeRetentionInterval", inbox.Config{Pool: pool, Consumer: "c", RetentionInterval: -time.Second}, []string{"Config.RetentionInterval"}},
		{"NegativeTxTimeout", inbox.Config{Pool: pool, Consumer: "c", TxTimeout: -time.Second}, []string{"Config.TxTimeout"}},
		{"LogStartWithoutPosition", inbox.Config{Pool: pool, Consumer: "c",
			LogStart: func(context.Context) (inbox.LogStart, error) { return nil, nil }}, []string{"Config.LogStart", "Config.Position"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in, err := inbox.New(tt.cfg)
			if tt.wantErr == nil {
				require.NoError(t, err)
				require.NotNil(t, in)
				return
			}
			require.Error(t, err)
			require.Nil(t, in)
			for _, s := range tt.wantErr {
				require.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	const week = 7 * 24 * time.Hour
	billing, b := setup(t, inbox.Config{Consumer: "billing", RetentionBatch: 2, Retention: week})
	shipping := b.newInbox(t, inbox.Config{Consumer: "shipping", Retention: week})

	deliverN := func(in *inbox.Inbox, n int) []string {
		h := &applier{consumer: in.Consumer()}
		ids := make([]string, n)
		for i := range ids {
			ids[i] = newID()
			require.NoError(t, deliver(b.ctx, in.Middleware(h.handle), ids[i], []byte(ids[i])))
		}
		return ids
	}
	billingIDs, shippingIDs := deliverN(billing, 8), deliverN(shipping, 3)
	backdate := func(age string, consumer string, ids []string) {
		_, err := b.pool.Exec(b.ctx, `UPDATE inbox_messages SET processed_at = now() - $1::interval
			WHERE consumer = $2 AND message_id = ANY($3)`, age, consumer, ids)
		require.NoError(t, err)
	}
	backdate("8 days", "billing", billingIDs[:5])  // past retention
	backdate("6 days", "billing", billingIDs[5:6]) // within it
	backdate("8 days", "shipping", shippingIDs)    // past retention, another consumer's

	// Stale and fresh attempt counters.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_attempts (consumer, message_id, attempts, last_error, updated_at) VALUES
		('billing', 'stale', 1, 'x', now() - interval '8 days'),
		('billing', 'fresh', 1, 'x', now()),
		('shipping', 'stale', 1, 'x', now() - interval '8 days')`)
	require.NoError(t, err)

	deleted, err := billing.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), deleted, "five old rows, in batches of two")

	remaining := func(consumer string) []string {
		rows, err := b.pool.Query(b.ctx, `SELECT message_id FROM inbox_messages WHERE consumer = $1 ORDER BY message_id`, consumer)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	require.ElementsMatch(t, billingIDs[5:], remaining("billing"))
	require.ElementsMatch(t, shippingIDs, remaining("shipping"), "another consumer's rows are not swept")
	require.ElementsMatch(t, []string{"billing/fresh", "shipping/stale"},
		func() []string {
			rows, err := b.pool.Query(b.ctx, `SELECT consumer || '/' || message_id FROM inbox_attempts`)
			require.NoError(t, err)
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			return keys
		}())

	deleted, err = billing.Sweep(b.ctx)
	require.NoError(t, err)
	require.Zero(t, deleted)
}

// TestRouterWithKafka runs the middleware where it lives: in a Watermill
// router, behind a watermill-kafka subscriber, against a real broker.
// TestMigrateCreatesTheDeadLetterPath: dead letters are published through
// the outbox, so inbox.Migrate alone must leave a database where a poison
// message is dead-lettered, not one where the dead letter fails for want of
// outbox_messages and the message comes back forever.
func TestMigrateCreatesTheDeadLetterPath(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name, url, err := createDatabase(ctx)
	require.NoError(t, err)
	pg.DropWhenDone(t, name)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, inbox.Migrate(ctx, pool)) // and nothing else

	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer})
	require.NoError(t, err)
	poison := func(*message.Message) ([]*message.Message, error) {
		return nil, inbox.Permanent(errors.New("unreadable"))
	}
	require.NoError(t, deliver(ctx, in.Middleware(poison), newID(), []byte(`{}`)))
	require.Equal(t, int64(1), in.Stats().DeadLettered)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1`, consumer+".dlq").Scan(&n))
	require.Equal(t, 1, n, "the dead letter waits in the outbox")
}

// TestSchemasAreSeparateInboxes: an inbox lives in the schema its pool's
// search_path names, its dead letters in that schema's outbox: two schemas
// of one database deduplicate apart, and neither sees the other's rows.
func TestSchemasAreSeparateInboxes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name, url, err := createDatabase(ctx)
	require.NoError(t, err)
	pg.DropWhenDone(t, name)
	inSchema := func(schema string) (*pgxpool.Pool, message.HandlerFunc) {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		_, err = pool.Exec(ctx, "CREATE SCHEMA "+schema+"; "+domainSchema)
		require.NoError(t, err)
		require.NoError(t, inbox.Migrate(ctx, pool))
		in, err := inbox.New(inbox.Config{Pool: pool, Consumer: consumer})
		require.NoError(t, err)
		return pool, in.Middleware((&applier{consumer: consumer}).handle)
	}
	poolA, a := inSchema("a")
	poolB, b := inSchema("b")
	id := newID()
	for range 2 {
		require.NoError(t, deliver(ctx, a, id, []byte(`{}`)))
		require.NoError(t, deliver(ctx, b, id, []byte(`{}`)))
	}
	for _, pool := range []*pgxpool.Pool{poolA, poolB} {
		var applied, rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM applied), (SELECT count(*) FROM inbox_messages)`).Scan(&applied, &rows))
		require.Equal(t, []int{1, 1}, []int{applied, rows}, "each schema applied the message once")
	}
	var tables int
	require.NoError(t, poolA.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
	require.Zero(t, tables, "nothing was created outside the schemas")
}

// TestSweepGoesOnPastRowsThatStay: each batch of a Sweep starts where the
// last one ended, so rows that may not go yet (parked, waiting for their
// key's release) are passed over, not deleted, and every expired row after
// them still goes in the same Sweep; ties on processed_at at a batch's end
// are not skipped.
func TestSweepGoesOnPastRowsThatStay(t *testing.T) {
	t.Parallel()
	const week = 7 * 24 * time.Hour
	in, b := setup(t, inbox.Config{Consumer: "billing", RetentionBatch: 2, Retention: week})
	// Nine expired rows, oldest first: m1..m9; m2 and m5 parked; m6 to m9
	// processed at the same moment (a batch's transaction).
	_, err := b.pool.Exec(b.ctx, `
		INSERT INTO inbox_messages (consumer, message_id, payload_sha256, status, processed_at)
		SELECT 'billing', 'm' || n, '\x00', CASE WHEN n IN (2, 5) THEN 'parked' ELSE 'processed' END,
		       now() - interval '8 days' + least(n, 6) * interval '1 s'
		FROM generate_series(1, 9) AS n`)
	require.NoError(t, err)
	deleted, err := in.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(7), deleted)
	left := scalar[[]string](t, b, `SELECT array_agg(message_id ORDER BY message_id) FROM inbox_messages WHERE consumer = 'billing'`)
	require.Equal(t, []string{"m2", "m5"}, left)
}
