package main

// The cost as the tables grow (-history N). Every other build starts from
// empty tables; users' do not: an inbox keeps every message id for its
// retention (15 days by default), and a busy outbox holds its published
// rows for the relay's. The history build is the project build on tables
// that already hold N rows each, in both services' inbox_messages and
// outbox_messages, generated with SQL (not replayed), then vacuumed and
// analyzed as autovacuum would have left them, and checkpointed. It runs in the same rounds
// as the others, so its figures sit beside the empty-table ones, measured
// minutes apart on the same machine.
//
// Nothing of the history expires during the run: the inbox rows are spread
// over the last 14 days (its retention is 15), the outbox rows over the
// last 23 hours with the relay's retention at 24 hours for this build. So
// what the figures show is the size of the tables and their indexes, not a
// sweep running beside the load. The sweep's own cost is measured after the
// saturation phase: each service's inbox Sweep and relay DeletePublished,
// through the library's public API, retiring the oldest tenth of the
// history, timed, with the dead tuples it leaves.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
)

const (
	inboxHistorySpan  = 14 * 24 * time.Hour
	outboxHistorySpan = 23 * time.Hour
)

// historyEnv is the history build's environment: none of its own; the
// relay keeps published rows 15 days (outbox.DefaultRetention), so none of
// the history expires during the run.
var historyEnv []string

// historyPayload is what an OrderPaid of two lines weighs.
var historyPayload = []byte(`{"v":1,"order_id":"00000000-0000-0000-0000-000000000000","lines":[{"sku":"sku-0001","quantity":2},{"sku":"sku-0002","quantity":1}],"paid_at":"2026-01-01T00:00:00Z"}`)

// Sweep is what retiring the oldest tenth of the history cost, per table.
type Sweep struct {
	Table     string  `json:"table"`
	Service   string  `json:"service"`
	Deleted   int64   `json:"deleted"`
	Seconds   float64 `json:"seconds"`
	RowsPerS  float64 `json:"rows_per_s"`
	DeadAfter int64   `json:"dead_tuples_after"`
	MBBefore  float64 `json:"table_and_indexes_mb_before"`
}

// History is the history build's own figures beside its Result.
type History struct {
	RowsPerTable int     `json:"rows_per_table"`
	FillSeconds  float64 `json:"fill_s"`
	Sweeps       []Sweep `json:"sweeps,omitempty"`
}

// serviceTopics are each service's consumed topic (its inbox history) and
// produced one (its outbox history).
var serviceTopics = map[string][2]string{
	"orders":    {events.TopicInventory, events.TopicOrders},
	"inventory": {events.TopicOrders, events.TopicInventory},
}

// fillHistory writes n rows into each service's inbox_messages and
// outbox_messages, then vacuums and analyzes both.
func fillHistory(ctx context.Context, pools map[string]*pgxpool.Pool, n int, say func(string, ...any)) (float64, error) {
	t0 := time.Now()
	for _, service := range []string{"orders", "inventory"} {
		pool, topics := pools[service], serviceTopics[service]
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		err = func() error {
			defer conn.Release()
			// The fill's own commits need not wait for the disk: it is
			// setup, not the measured load.
			if _, err := conn.Exec(ctx, `SET synchronous_commit = off`); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, `
				INSERT INTO inbox_messages (consumer, message_id, payload_sha256, status, topic, processed_at)
				SELECT $1, 'history-' || g, sha256(int8send(g)), 'processed', $2, now() - $3::interval * (g::float8 / $4)
				FROM generate_series(1, $4::bigint) g`, service, topics[0], inboxHistorySpan, n); err != nil {
				return fmt.Errorf("%s inbox history: %w", service, err)
			}
			if _, err := conn.Exec(ctx, `
				INSERT INTO outbox_messages (message_id, topic, partition_key, payload, created_at, published_at)
				SELECT gen_random_uuid(), $1, 'history-' || (g % 100000), $2::bytea, t, t
				FROM (SELECT g, now() - $3::interval * (g::float8 / $4) AS t FROM generate_series(1, $4::bigint) g) s`,
				topics[1], historyPayload, outboxHistorySpan, n); err != nil {
				return fmt.Errorf("%s outbox history: %w", service, err)
			}
			if _, err := conn.Exec(ctx, `VACUUM (ANALYZE) inbox_messages, outbox_messages`); err != nil {
				return fmt.Errorf("%s vacuum: %w", service, err)
			}
			// The fill wrote gigabytes of WAL: write it out now, or the
			// checkpoint it forces lands in the measured load, which a system
			// that grew its tables over weeks never pays at once.
			if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
				return fmt.Errorf("%s checkpoint: %w", service, err)
			}
			return nil
		}()
		if err != nil {
			return 0, err
		}
		say("history: %s holds %d inbox and %d outbox rows (%s so far)", service, n, n, time.Since(t0).Round(time.Second))
	}
	return time.Since(t0).Seconds(), nil
}

// sweepHistory retires the oldest tenth of each table's history through
// the library's own retention, timed.
func sweepHistory(ctx context.Context, pools map[string]*pgxpool.Pool) ([]Sweep, error) {
	var out []Sweep
	for _, service := range []string{"orders", "inventory"} {
		pool := pools[service]
		in, err := inbox.New(inbox.Config{Pool: pool, Consumer: service, Retention: inboxHistorySpan * 9 / 10})
		if err != nil {
			return nil, err
		}
		relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: discard{}, Retention: outboxHistorySpan * 9 / 10})
		if err != nil {
			return nil, err
		}
		for _, t := range []struct {
			table string
			sweep func(context.Context) (int64, error)
		}{{"inbox_messages", in.Sweep}, {"outbox_messages", relay.DeletePublished}} {
			s := Sweep{Table: t.table, Service: service}
			if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1::regclass) / 1e6`, t.table).Scan(&s.MBBefore); err != nil {
				return nil, err
			}
			t0 := time.Now()
			if s.Deleted, err = t.sweep(ctx); err != nil {
				return nil, fmt.Errorf("%s %s: %w", service, t.table, err)
			}
			s.Seconds = time.Since(t0).Seconds()
			s.RowsPerS = float64(s.Deleted) / s.Seconds
			time.Sleep(time.Second) // the statistics collector reports about once a second
			if err := pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1`, t.table).Scan(&s.DeadAfter); err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}
