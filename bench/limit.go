package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/migrate"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
)

// runLimit replays the statements of a round trip straight against
// Postgres, LimitBatch orders per transaction: the orders payment with its
// outbox rows; the relay's claim and mark; inventory's inbox rows,
// reservation and outbox rows; the relay again; orders' inbox rows and
// status. No Kafka and no Go services: the ceiling this machine's database
// allows for the same durable work.
func runLimit(ctx context.Context, pg *pgtest.Server, p params, round int, say func(string, ...any)) (Result, error) {
	res := Result{Build: "limit", Notes: fmt.Sprintf("%d orders per transaction, 4 workers; hop = payment commit → inventory commit, run back to back", p.LimitBatch)}
	root, err := procs.ModuleRoot()
	if err != nil {
		return res, err
	}
	pools := map[string]*pgxpool.Pool{}
	urls := map[string]string{}
	prefix := fmt.Sprintf("bench_limit_r%d_", round)
	defer dropDatabases(pg, prefix+"orders", prefix+"inventory") // runs after the pools close
	for _, name := range []string{"orders", "inventory"} {
		url, err := pg.CreateDatabase(ctx, prefix+name)
		if err != nil {
			return res, err
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			return res, err
		}
		defer pool.Close()
		if err := outbox.Migrate(ctx, pool); err != nil {
			return res, err
		}
		if err := inbox.Migrate(ctx, pool); err != nil {
			return res, err
		}
		if err := migrate.Apply(ctx, pool, name, os.DirFS(filepath.Join(root, "services", name, "migrations"))); err != nil {
			return res, err
		}
		pools[name], urls[name] = pool, url
	}
	orders, inventory := pools["orders"], pools["inventory"]
	skus := loadgen.SKUs(p.SKUs)
	if _, err := inventory.Exec(ctx, `INSERT INTO stock (sku, available) SELECT unnest($1::text[]), 1073741824`, skus); err != nil {
		return res, err
	}
	rng := rand.New(rand.NewPCG(p.Seed, 1))
	latencyOrders := int(p.LatencyRate * p.LatencyFor)
	ids, err := createOrders(ctx, orders, p.Orders+latencyOrders, rng, skus)
	if err != nil {
		return res, err
	}

	cpu0 := cpuSeconds(nil, nil)
	tx0, err := xacts(ctx, orders, urls)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	batches := make(chan []string)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				if err := roundTripBatch(ctx, orders, inventory, b); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := 0; i < p.Orders; i += p.LimitBatch {
		batches <- ids[i:min(i+p.LimitBatch, p.Orders)]
	}
	close(batches)
	wg.Wait()
	select {
	case err := <-errs:
		return res, err
	default:
	}
	elapsed := time.Since(t0)
	cpu1 := cpuSeconds(nil, nil)
	time.Sleep(1500 * time.Millisecond)
	tx1, err := xacts(ctx, orders, urls)
	if err != nil {
		return res, err
	}
	res.SaturationS = elapsed.Seconds()
	res.RoundTripsPerS = float64(p.Orders) / elapsed.Seconds()
	res.DBTxPerMessage = float64(tx1-tx0-1) / float64(2*p.Orders)
	res.CPU = cpu1.sub(cpu0).per1000(p.Orders)
	res.CPUSPer1000 = res.CPU.total()
	say("limit: %d round trips in %s", p.Orders, elapsed.Round(time.Millisecond))

	// Latency: at the offered rate, each order's payment and then its
	// reservation, back to back, one order per transaction.
	var mu sync.Mutex
	var hops []float64
	ticker := time.NewTicker(time.Duration(float64(time.Second) / p.LatencyRate))
	defer ticker.Stop()
	work := make(chan string)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				if err := roundTripBatch(ctx, orders, inventory, []string{id}, func(paid, reserved time.Time) {
					mu.Lock()
					hops = append(hops, float64(reserved.Sub(paid).Microseconds())/1000)
					mu.Unlock()
				}); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	cpu0, t0 = cpuSeconds(nil, nil), time.Now()
	for _, id := range ids[p.Orders:] {
		<-ticker.C
		work <- id
	}
	close(work)
	wg.Wait()
	use, secs := cpuSeconds(nil, nil).sub(cpu0), time.Since(t0).Seconds()
	res.LatencyCoresBusy = use.total() / secs
	res.LatencyCores = use.scaled(1 / secs)
	select {
	case err := <-errs:
		return res, err
	default:
	}
	res.HopLatencyMS, res.LatencySamples = percentiles(hops), len(hops)
	return res, nil
}

// roundTripBatch runs the five transactions of a round trip for a batch of
// orders. timed, when given, receives the commit times of the payment and
// of inventory's reservation.
func roundTripBatch(ctx context.Context, orders, inventory *pgxpool.Pool, ids []string, timed ...func(paid, reserved time.Time)) error {
	// 1. orders: pay, with the OrderPaid outbox rows.
	var msgs []*message.Message
	var skus []string
	var qty []int32
	var resOrders []string
	err := pgx.BeginFunc(ctx, orders, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE orders SET status = 'paid', paid_at = now() WHERE id = ANY($1) AND status = 'created' RETURNING id::text, lines`, ids)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			var lines []events.Line
			if err := rows.Scan(&id, &lines); err != nil {
				return err
			}
			payload, _ := events.Encode(events.OrderPaid{Envelope: events.NewEnvelope(events.TypeOrderPaid, id), Lines: lines})
			msgs = append(msgs, outbox.NewMessage(id, payload))
			for _, l := range lines {
				resOrders, skus, qty = append(resOrders, id), append(skus, l.SKU), append(qty, int32(l.Quantity))
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, events.TopicOrders, msgs...)
	})
	if err != nil {
		return fmt.Errorf("pay: %w", err)
	}
	paidAt := time.Now()
	// 2. the orders relay: claim and mark.
	if err := relayBatch(ctx, orders, len(ids)); err != nil {
		return err
	}
	// 3. inventory: inbox rows, stock locked in SKU order, reservation,
	// InventoryReserved outbox rows.
	msgIDs := make([]string, len(msgs))
	sums := make([][]byte, len(msgs))
	var answers []*message.Message
	for i, m := range msgs {
		msgIDs[i] = m.UUID
		sums[i] = make([]byte, 32)
		payload, _ := events.Encode(events.InventoryReserved{Envelope: events.NewEnvelope(events.TypeInventoryReserved, m.Metadata.Get(outbox.KeyMetadata))})
		answers = append(answers, outbox.NewMessage(m.Metadata.Get(outbox.KeyMetadata), payload))
	}
	locked := append([]string(nil), skus...)
	sort.Strings(locked)
	err = pgx.BeginFunc(ctx, inventory, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic)
			SELECT 'inventory', unnest($1::text[]), unnest($2::bytea[]), $3 ON CONFLICT DO NOTHING`, msgIDs, sums, events.TopicOrders); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT sku FROM stock WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, locked); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
			UPDATE stock s SET available = s.available - u.qty, reserved = s.reserved + u.qty, updated_at = now()
			FROM (SELECT sku, sum(qty)::int AS qty FROM unnest($1::text[], $2::int[]) AS x(sku, qty) GROUP BY sku) u
			WHERE s.sku = u.sku`, skus, qty); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity, message_id)
			SELECT o, s, q, 'limit' FROM unnest($1::text[], $2::text[], $3::int[]) AS x(o, s, q)`, resOrders, skus, qty); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, events.TopicInventory, answers...)
	})
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	reservedAt := time.Now()
	// 4. the inventory relay.
	if err := relayBatch(ctx, inventory, len(ids)); err != nil {
		return err
	}
	// 5. orders: inbox rows, status, the applied event.
	answerIDs := make([]string, len(answers))
	for i, m := range answers {
		answerIDs[i] = m.UUID
	}
	err = pgx.BeginFunc(ctx, orders, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO inbox_messages (consumer, message_id, payload_sha256, topic)
			SELECT 'orders', unnest($1::text[]), unnest($2::bytea[]), $3 ON CONFLICT DO NOTHING`, answerIDs, sums, events.TopicInventory); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'reserved', settled_at = now() WHERE id = ANY($1) AND status = 'paid'`, ids); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO order_events (order_id, event, message_id)
			SELECT unnest($1::uuid[]), 'InventoryReserved', unnest($2::text[])`, ids, answerIDs)
		return err
	})
	if err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	for _, f := range timed {
		f(paidAt, reservedAt)
	}
	return nil
}

// relayBatch is the relay's transaction, run by pkg/outbox's own Relay with
// a publisher that sends nothing: claim and mark the oldest unpublished rows
// in one statement, commit. Parallel, because the four workers' relays would
// otherwise skip their turn whenever another one holds the advisory lock; the
// statement is the same but for the lock.
func relayBatch(ctx context.Context, pool *pgxpool.Pool, n int) error {
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: discard{}, BatchSize: n, Parallel: true})
	if err != nil {
		return err
	}
	_, err = relay.RelayOnce(ctx)
	return err
}

// discard is a message.Publisher that drops everything: the limit has no
// broker.
type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }
