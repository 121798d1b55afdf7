// Command demo runs the whole system on this machine and shows the pattern
// at work: a Postgres (DATABASE_URL, or a throwaway cluster), a Kafka-protocol
// broker (KAFKA_BROKERS, or embedded kfake), orders and inventory as two OS
// processes, and a load generator that creates and pays orders. It replays
// one message on purpose, checks every paid order with SQL, prints what
// happened, and exits non-zero if any paid order did not end reserved or
// rejected within the deadline.
//
//	go run ./cmd/demo -orders 1000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/internal/check"
	"github.com/outboxref/outbox-inbox/internal/kafkaconf"
	"github.com/outboxref/outbox-inbox/internal/loadgen"
	"github.com/outboxref/outbox-inbox/internal/procs"
	"github.com/outboxref/outbox-inbox/internal/stack"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAIL:", err)
		os.Exit(1)
	}
}

type options struct {
	orders      int
	concurrency int
	deadline    time.Duration
	seed        uint64
	keep        bool
}

func run(ctx context.Context) error {
	var o options
	flag.IntVar(&o.orders, "orders", 1000, "orders to create and pay")
	flag.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients")
	flag.DurationVar(&o.deadline, "deadline", 2*time.Minute, "how long paid orders may take to settle")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seeds the order contents")
	flag.BoolVar(&o.keep, "keep", false, "keep the stack running after the check, until interrupted")
	flag.Parse()

	say("seed %d; %d orders, %d clients", o.seed, o.orders, o.concurrency)
	work, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		return err
	}
	say("logs and binaries in %s", work)

	say("building services")
	bins, err := procs.Build(ctx, work, "./services/orders", "./services/inventory")
	if err != nil {
		return err
	}

	pg, err := stack.StartPostgres(ctx)
	if err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	defer pg.Stop() //nolint:errcheck
	if pg.External() {
		say("postgres: DATABASE_URL")
	} else {
		say("postgres: throwaway cluster in %s", pg.Dir())
	}
	ordersURL, err := pg.CreateDatabase(ctx, "orders")
	if err != nil {
		return err
	}
	inventoryURL, err := pg.CreateDatabase(ctx, "inventory")
	if err != nil {
		return err
	}

	kafkaStack, err := stack.StartKafka(ctx, stack.KafkaOptions{
		Topics: []string{events.TopicOrders, events.TopicInventory, "orders.dlq", "inventory.dlq"},
	})
	if err != nil {
		return fmt.Errorf("starting kafka: %w", err)
	}
	defer kafkaStack.Close()
	brokers := kafkaStack.Brokers()
	if kafkaStack.External() {
		say("kafka: KAFKA_BROKERS %v", brokers)
	} else {
		say("kafka: embedded kfake broker at %v", brokers)
	}

	services := map[string]*procs.Proc{}
	for name, url := range map[string]string{"orders": ordersURL, "inventory": inventoryURL} {
		addr, err := procs.FreeAddr()
		if err != nil {
			return err
		}
		logFile, err := os.Create(filepath.Join(work, name+".log"))
		if err != nil {
			return err
		}
		defer logFile.Close()
		p := &procs.Proc{Name: name, Bin: bins[name], Addr: addr, Log: logFile, Env: []string{
			"DATABASE_URL=" + url, "KAFKA_BROKERS=" + joinComma(brokers),
		}}
		if err := p.Start(); err != nil {
			return err
		}
		defer p.Stop(30 * time.Second) //nolint:errcheck
		services[name] = p
	}
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for name, p := range services {
		if err := p.WaitReady(readyCtx); err != nil {
			return fmt.Errorf("%w (see %s)", err, filepath.Join(work, name+".log"))
		}
		say("%s ready at http://%s (pid %d)", name, p.Addr, p.Pid())
	}

	client := loadgen.NewClient([]string{"http://" + services["orders"].Addr}, []string{"http://" + services["inventory"].Addr})
	skus := loadgen.SKUs(20)
	stock := loadgen.StockFor(o.orders, skus)
	if err := client.SeedStock(ctx, stock); err != nil {
		return fmt.Errorf("seeding stock: %w", err)
	}
	say("seeded %d SKUs (two of them scarce, so some orders are rejected)", len(stock))

	start := time.Now()
	res, err := loadgen.Run(ctx, client, skus, loadgen.Plan{
		Orders: o.orders, Concurrency: o.concurrency, DoubleSubmit: 50, Seed: o.seed,
	})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	say("paid %d orders in %s (%d paid twice at once on purpose)", len(res.Paid), time.Since(start).Round(time.Millisecond), res.DoubleSubmits)

	pools, err := openPools(ctx, ordersURL, inventoryURL)
	if err != nil {
		return err
	}
	defer pools[0].Close()
	defer pools[1].Close()

	replayed, err := replayOne(ctx, pools[0], brokers)
	if err != nil {
		return fmt.Errorf("replaying a message: %w", err)
	}
	say("replayed OrderPaid %s onto %s on purpose: the inventory inbox must suppress it", replayed, events.TopicOrders)

	report, err := waitSettled(ctx, pools, stock, len(res.Paid), o.deadline)
	if err != nil {
		return err
	}
	printReport(report, time.Since(start))
	if !report.OK() {
		return errors.New("an invariant failed (see above)")
	}
	if report.OrdersPaid != len(res.Paid) {
		return fmt.Errorf("the load generator paid %d orders, the orders database has %d", len(res.Paid), report.OrdersPaid)
	}
	if o.keep {
		say("stack kept running: orders http://%s, inventory http://%s; Ctrl-C to stop", services["orders"].Addr, services["inventory"].Addr)
		<-ctx.Done()
	}
	say("stopping services gracefully")
	for _, p := range services {
		if err := p.Stop(30 * time.Second); err != nil {
			return fmt.Errorf("stopping %s: %w", p.Name, err)
		}
	}
	say("PASS")
	return nil
}

func openPools(ctx context.Context, urls ...string) ([]*pgxpool.Pool, error) {
	var pools []*pgxpool.Pool
	for _, u := range urls {
		p, err := pgxpool.New(ctx, u)
		if err != nil {
			for _, q := range pools {
				q.Close()
			}
			return nil, err
		}
		pools = append(pools, p)
	}
	return pools, nil
}

// replayOne publishes an already-published OrderPaid again, with its id,
// key and payload, as a relay that crashed before marking it would.
func replayOne(ctx context.Context, orders *pgxpool.Pool, brokers []string) (string, error) {
	var id, key string
	var payload []byte
	err := orders.QueryRow(ctx, `
		SELECT message_id::text, partition_key, payload FROM outbox_messages
		WHERE topic = $1 AND published_at IS NOT NULL ORDER BY id LIMIT 1`, events.TopicOrders).Scan(&id, &key, &payload)
	if err != nil {
		return "", err
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey),
		OverwriteSaramaConfig: kafkaconf.Sarama(),
	}, watermill.NopLogger{})
	if err != nil {
		return "", err
	}
	defer pub.Close()
	msg := message.NewMessage(id, payload)
	msg.Metadata.Set(outbox.KeyMetadata, key)
	return id, pub.Publish(events.TopicOrders, msg)
}

// waitSettled polls until every paid order is settled, both outboxes are
// drained and the replayed message was suppressed, or the deadline passes;
// it returns the final check either way.
func waitSettled(ctx context.Context, pools []*pgxpool.Pool, stock map[string]int, paid int, deadline time.Duration) (check.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	last := time.Now()
	for {
		report, err := check.Run(ctx, pools[0], pools[1], stock)
		if err != nil {
			if ctx.Err() != nil {
				return report, fmt.Errorf("paid orders not settled within %s: %w", deadline, err)
			}
			return report, err
		}
		lost, _ := report.Invariant(check.NothingLost)
		if lost.OK && report.OrdersPaid >= paid && report.DuplicatesSuppressed > 0 {
			return report, nil
		}
		if time.Since(last) > 2*time.Second {
			say("waiting: %d of %d paid orders settled", report.Reserved+report.Rejected, report.OrdersPaid)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			// Return the last report: its invariants say what is missing.
			say("deadline of %s passed", deadline)
			return report, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func printReport(r check.Report, took time.Duration) {
	say("")
	say("what happened (%s):", took.Round(time.Millisecond))
	say("  orders paid:            %d", r.OrdersPaid)
	say("  reserved:               %d", r.Reserved)
	say("  rejected (no stock):    %d", r.Rejected)
	say("  not settled:            %d", r.Unsettled)
	say("  duplicates suppressed:  %d", r.DuplicatesSuppressed)
	say("  outbox rows pending:    orders %d, inventory %d", r.OutboxPending["orders"], r.OutboxPending["inventory"])
	for k, n := range r.Quarantined {
		say("  quarantined %-12s %d", k+":", n)
	}
	say("")
	for _, inv := range r.Invariants {
		status := "PASS"
		if !inv.OK {
			status = "FAIL"
		}
		say("  %s  %-17s %s", status, inv.Name, inv.Detail)
	}
	say("")
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }

func joinComma(s []string) string {
	out := ""
	for i, b := range s {
		if i > 0 {
			out += ","
		}
		out += b
	}
	return out
}
