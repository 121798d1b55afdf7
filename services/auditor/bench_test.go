package main

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// BenchmarkRound: what a round behind the watermark costs, side by side
// over a short history and a long one (AUDIT_BENCH_HISTORY orders, default
// 200,000; docs/benchmark.md gives the figures at 10,000,000). Each op is
// one round after 1,250 new orders (five seconds of 250 orders a second,
// the auditor's interval: paid, reserved, captured and sold), all four
// checks caught up. Its ns/op is the auditor's work per five seconds at
// that rate; the two histories' ratio is what the size of the tables adds.
func BenchmarkRound(b *testing.B) {
	long := 200_000
	if raw := os.Getenv("AUDIT_BENCH_HISTORY"); raw != "" {
		n, err := strconv.Atoi(raw)
		require.NoError(b, err)
		long = n
	}
	// The testing package runs a sub-benchmark's function twice (once with
	// N = 1, then with N = 20): each history is written and caught up once,
	// by the first, into databases that live as long as this benchmark.
	parent := b
	prepared := map[int]*benchWorld{}
	for _, history := range []int{10_000, long} {
		b.Run(fmt.Sprintf("history=%d", history), func(b *testing.B) {
			p := prepared[history]
			if p == nil {
				p = &benchWorld{w: newWorld(parent), next: history}
				p.w.t = b
				p.w.history(history)
				var err error
				p.a, err = audit.New(p.w.state, audit.Config{Grace: time.Minute, Batch: 5000, BatchesPerRound: 1_000_000},
					domain{orders: p.w.orders, inventory: p.w.inventory, grace: time.Minute}.checks()...)
				require.NoError(b, err)
				started := time.Now()
				_, err = p.a.Round(b.Context()) // the catch-up over the whole history
				require.NoError(b, err)
				p.catchUp = time.Since(started)
				prepared[history] = p
			}
			w := p.w
			w.t = b
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				w.batch(p.next, 1250)
				p.next += 1250
				b.StartTimer()
				r, err := p.a.Round(b.Context())
				require.NoError(b, err)
				for _, c := range r.Checks {
					require.True(b, c.CaughtUp, c.Check)
				}
			}
			b.StopTimer()
			b.ReportMetric(p.catchUp.Seconds(), "catch-up-s")
			require.Empty(b, w.ever(), "a clean history raises nothing")
		})
	}
}

// benchWorld is a history written and caught up once for BenchmarkRound.
type benchWorld struct {
	w       *world
	a       *audit.Auditor
	catchUp time.Duration
	next    int // the next order's number
}

// history writes n settled orders (paid three hours ago, a millisecond
// apart), each reserved, captured and sold (one unit of SKU A), as both
// services record them, and the stock that balances them.
func (w *world) history(n int) {
	w.t.Helper()
	w.batchAt(0, n, "3 hours")
	for _, p := range []string{"orders", "inventory"} {
		pool := w.orders
		if p == "inventory" {
			pool = w.inventory
		}
		w.exec(pool, `VACUUM ANALYZE`)
	}
}

// batch writes n orders from number from on, paid two minutes ago.
func (w *world) batch(from, n int) { w.batchAt(from, n, "2 minutes") }

func (w *world) batchAt(from, n int, ago string) {
	w.t.Helper()
	w.exec(w.orders, `INSERT INTO orders (id, status, lines, payment, paid_at, created_at, settled_at, payment_at)
		SELECT md5('o' || i)::uuid, 'reserved', '[{"sku":"A","quantity":1}]', 'captured',
			now() - $3::interval + (i - $1) * interval '1 microsecond', now() - $3::interval - interval '1 minute',
			now() - $3::interval, now() - $3::interval
		FROM generate_series($1::int, $1::int + $2::int - 1) i`, from, n, ago)
	w.exec(w.inventory, `INSERT INTO decisions (order_id, decision, message_id, decided_at, fulfilled_by, fulfilled_at)
		SELECT md5('o' || i)::uuid::text, 'reserved', 'm', now() - $3::interval, 'm', now() - $3::interval
		FROM generate_series($1::int, $1::int + $2::int - 1) i`, from, n, ago)
	for _, table := range []string{"reservations", "fulfilments"} {
		w.exec(w.inventory, `INSERT INTO `+table+` (order_id, sku, quantity, message_id, created_at)
			SELECT md5('o' || i)::uuid::text, 'A', 1, 'm', now() - $3::interval
			FROM generate_series($1::int, $1::int + $2::int - 1) i`, from, n, ago)
	}
	w.exec(w.inventory, `UPDATE stock SET sold = sold + $1 WHERE sku = 'A'`, n)
}
