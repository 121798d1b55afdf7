package stack

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

// BenchmarkStandbyPrice prices what a transaction costs the one who waits
// for its answer, side by side in one run: one Postgres node; three nodes
// under Patroni replicating asynchronously, without and with pkg/standby's
// gate (DATABASE_STANDBYS=1); and synchronously (strict). An op is a small
// transaction (one row) committed and, where a gate waits, held by a
// standby; 1 and 16 clients at once. It reports the mean (ns/op), the p99
// and, for 16 clients, commits per second.
//
//	REQUIRE_PATRONI=1 go test -run '^$' -bench StandbyPrice -benchtime 3000x ./chaos/stack/
func BenchmarkStandbyPrice(b *testing.B) {
	RequirePatroni(b)
	setups := []struct {
		name string
		pool func(b *testing.B) *pgxpool.Pool
		poll time.Duration // the gate's PollInterval; 0: no gate
	}{
		{"one_node", onePostgres, 0},
		{"async", func(b *testing.B) *pgxpool.Pool { return patroniPool(b, false) }, 0},
		// the async cluster's pool, with the gate, polling as often as
		// standby.DefaultPollInterval and more and less often
		{"async_gate_poll=2ms", nil, 2 * time.Millisecond},
		{"async_gate_poll=500µs", nil, 500 * time.Microsecond}, // the default
		{"async_gate_poll=200µs", nil, 200 * time.Microsecond},
		{"sync_strict", func(b *testing.B) *pgxpool.Pool { return patroniPool(b, true) }, 0},
	}
	var last *pgxpool.Pool
	for _, s := range setups {
		pool := last
		if s.pool != nil {
			pool = s.pool(b)
		}
		last = pool
		var gate *standby.Gate
		if s.poll > 0 {
			var err error
			if gate, err = standby.New(standby.Config{Pool: pool, Standbys: 1, PollInterval: s.poll}); err != nil {
				b.Fatal(err)
			}
		}
		for _, clients := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/clients=%d", s.name, clients), func(b *testing.B) {
				benchWrites(b, pool, gate, clients)
			})
		}
	}
}

// benchWrites runs b.N writes by clients at once and reports their p99.
func benchWrites(b *testing.B, pool *pgxpool.Pool, gate *standby.Gate, clients int) {
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				t0 := time.Now()
				var ticket standby.Ticket
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) {
					if _, err = tx.Exec(ctx, `INSERT INTO price (at) VALUES (now())`); err != nil {
						return err
					}
					ticket, err = gate.Mark(ctx, tx)
					return err
				})
				if err == nil {
					err = gate.Wait(ctx, ticket)
				}
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, time.Since(t0))
				mu.Unlock()
			}
		}()
	}
	b.ResetTimer()
	for i := range b.N {
		work <- i
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commits/s")
	if gate != nil {
		b.ReportMetric(float64(gate.Stats().Reads)/float64(gate.Stats().Released), "reads/wait")
	}
}

func onePostgres(b *testing.B) *pgxpool.Pool {
	ctx := context.Background()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pg.Stop() }) //nolint:errcheck
	url, err := pg.CreateDatabase(ctx, "price")
	if err != nil {
		b.Fatal(err)
	}
	return pricePool(b, url)
}

func patroniPool(b *testing.B, sync bool) *pgxpool.Pool {
	ctx := context.Background()
	c, err := StartPatroni(ctx, PatroniOptions{Synchronous: sync, Log: func(string, ...any) {}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	if err := c.WaitHealthy(ctx); err != nil {
		b.Fatal(err)
	}
	url, err := c.CreateDatabase(ctx, "price")
	if err != nil {
		b.Fatal(err)
	}
	return pricePool(b, url)
}

func pricePool(b *testing.B, url string) *pgxpool.Pool {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE price (id bigserial PRIMARY KEY, at timestamptz NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}
