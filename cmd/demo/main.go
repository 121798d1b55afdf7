// Command demo runs the whole system on this machine and shows the pattern
// at work: a Postgres (DATABASE_URL, or a throwaway cluster), a Kafka-protocol
// broker (KAFKA_BROKERS, or embedded kfake), orders and inventory as two OS
// processes, and a load generator that creates and pays orders. It replays
// one message on purpose, checks every paid order with SQL, prints what
// happened, and exits non-zero if any paid order did not end reserved or
// rejected within the deadline.
//
//	go run ./cmd/demo -orders 1000
//
// With ORDERS_URL and INVENTORY_URL set it starts nothing and drives the
// services at those URLs instead (external.go): the `demo` container of
// docker-compose.yml.
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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/dashboard"
	"github.com/outboxref/outbox-inbox/dashboard/crashnow"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkainit"
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
	trickle     float64
	dashboard   string
}

func run(ctx context.Context) error {
	var o options
	flag.IntVar(&o.orders, "orders", 1000, "orders to create and pay")
	flag.IntVar(&o.concurrency, "concurrency", 16, "concurrent clients")
	flag.DurationVar(&o.deadline, "deadline", 2*time.Minute, "how long paid orders may take to settle")
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "seeds the order contents")
	flag.BoolVar(&o.keep, "keep", false, "keep the stack running after the check, until interrupted; the live page then offers \"crash it now\"")
	flag.Float64Var(&o.trickle, "trickle", 0, "orders per second to keep paying while -keep holds the stack (0: none)")
	flag.StringVar(&o.dashboard, "dashboard", "127.0.0.1:8090", "address of the live page (cmd/dashboard)")
	flag.Parse()

	say("seed %d; %d orders, %d clients", o.seed, o.orders, o.concurrency)
	if ext, ok, err := externalFromEnv(); ok {
		if err != nil {
			return err
		}
		return runExternal(ctx, o, ext) // external.go: services already running (docker-compose.yml)
	}
	work, err := os.MkdirTemp("", "outbox-demo-")
	if err != nil {
		return err
	}
	// The services are failpoint builds (chaos/procs). With -keep they
	// get a failpoint log and a trace line at every delivery, so the live
	// page can teach the crash windows (dashboard/crashnow) once the check
	// below is done.
	fpLog := filepath.Join(work, "failpoints.log")
	sopts := system.Options{Work: work, Log: say}
	consoles := map[string]string{} // service → its console's address
	if o.keep {
		crashnow.Prepare(&sopts, fpLog)
		// Each service's console (pkg/console), on loopback, without
		// logins: this machine's browser only.
		for _, name := range []string{"orders", "inventory"} {
			addr, err := procs.FreeAddr()
			if err != nil {
				return err
			}
			consoles[name] = addr
			if sopts.EnvFor == nil {
				sopts.EnvFor = map[string][]string{}
			}
			sopts.EnvFor[name] = append(sopts.EnvFor[name], "CONSOLE_ADDR="+addr)
		}
	}
	sys, err := system.Start(ctx, sopts)
	if err != nil {
		return err
	}
	defer sys.Stop()
	say("logs in %s", sys.Work)
	lab := crashnow.New(ctx, sys, fpLog)
	defer lab.Wait() // before sys.Stop: a lesson ends with ctx
	// The page reads Kafka's offsets as a principal of its own, as in
	// docker-compose.yml: it may describe the topics and groups, no more.
	pageLogin, err := sys.Kafka.AddPrincipal(ctx, "dashboard", kafkainit.Grants("dashboard")...)
	if err != nil {
		return err
	}
	dopts := dashboard.Options{Orders: sys.Pools["orders"], Inventory: sys.Pools["inventory"], Audit: sys.Pools["audit"],
		Brokers: sys.Kafka.Brokers(), KafkaLogin: pageLogin, TraceURL: os.Getenv("DASHBOARD_TRACE_URL")}
	if o.keep {
		dopts.Crash = lab
	}
	dash, err := dashboard.Start(ctx, o.dashboard, dopts)
	if err != nil { // the port is taken, say: any free one on loopback will do
		say("live page: %v; on a free loopback port instead", err)
		if dash, err = dashboard.Start(ctx, "127.0.0.1:0", dopts); err != nil {
			return err
		}
	}
	say("live page: %s (-keep keeps it up after the run)", dash)

	client := sys.Client
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

	orders, inventory := sys.Pools["orders"], sys.Pools["inventory"]
	replayed, err := replayOne(ctx, orders, sys.Kafka.Brokers(), sys.SignAsProducer)
	if err != nil {
		return fmt.Errorf("replaying a message: %w", err)
	}
	say("replayed OrderPaid %s onto %s on purpose: the inventory inbox must suppress it", replayed, events.TopicOrders)

	waitCtx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	settled := judge.Settled(len(res.Paid))
	report, err := judge.Wait(waitCtx, orders, inventory, stock, res.Client(),
		func(r judge.Report) bool { return settled(r) && r.DuplicatesSuppressed > 0 },
		func(r judge.Report) {
			say("waiting: %s", progressLine(r))
		})
	if err != nil && waitCtx.Err() == nil {
		return err
	}
	printReport(report, time.Since(start))
	if !report.OK() {
		return errors.New("an invariant failed (see above)")
	}
	if err != nil {
		return fmt.Errorf("not settled within %s: the replayed message was not suppressed (duplicates: %d)", o.deadline, report.DuplicatesSuppressed)
	}
	// The auditor watched the run live: once it has caught up with it, it
	// must have raised nothing.
	say("waiting for the auditor to examine the last orders (grace %s)", sys.AuditGrace)
	findings, err := judge.AuditAfter(waitCtx, sys.Pools["audit"], sys.AuditGrace)
	if err != nil {
		return err
	}
	quiet := judge.AuditVerdict(findings)
	printInvariant(quiet)
	if !quiet.OK {
		return errors.New("the auditor found something wrong (see above; the findings: GET /findings on the auditor, " + sys.Auditor.Addr + ")")
	}
	if o.keep {
		if err := lab.Enable(ctx); err != nil {
			return err
		}
		say("stack kept running: orders http://%s, inventory http://%s; Ctrl-C to stop", sys.Procs["orders"][0].Addr, sys.Procs["inventory"][0].Addr)
		say("live page: %s : follow an order, or pick a crash window and press \"crash it now\"", dash)
		say("consoles (dead letters by failure group, retry and drop, the history): orders http://%s, inventory http://%s", consoles["orders"], consoles["inventory"])
		if o.trickle > 0 {
			go trickle(ctx, sys, lab, o.trickle)
		}
		<-ctx.Done()
	}
	say("stopping services gracefully")
	if err := sys.StopServices(30 * time.Second); err != nil {
		return fmt.Errorf("stopping services: %w", err)
	}
	say("PASS")
	return nil
}

// trickle pays orders at rate per second until ctx ends, so the live page
// has something moving; it holds back while a crash lesson runs, so the
// lesson's own order is the one that meets the window.
func trickle(ctx context.Context, sys *system.System, lab *crashnow.Lab, rate float64) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if lab.Busy() {
			continue
		}
		o, err := sys.Client.CreateOrder(ctx, []events.Line{{SKU: crashnow.SKU, Quantity: 1}})
		if err == nil {
			_, err = sys.Client.Pay(ctx, o.ID)
		}
		if err != nil && ctx.Err() == nil {
			say("trickle: %v", err)
		}
	}
}

// replayOne publishes an already-published OrderPaid again, with its id,
// key and payload, as a relay that crashed before marking it would.
func replayOne(ctx context.Context, orders *pgxpool.Pool, brokers []string, sign signer) (string, error) {
	var id, key string
	var payload []byte
	err := orders.QueryRow(ctx, `
		SELECT message_id::text, partition_key, payload FROM outbox_messages
		WHERE topic = $1 AND published_at IS NOT NULL AND `+events.OutboxType+` = $2 ORDER BY id LIMIT 1`, events.TopicOrders, events.TypeOrderPaid).Scan(&id, &key, &payload)
	if err != nil {
		return "", err
	}
	return id, republish(brokers, id, key, payload, sign)
}

// signer signs a record as its topic's producer would (its relay signs
// what it publishes); nil when the services do not sign.
type signer func(topic string, msg *message.Message)

// republish publishes an OrderPaid again straight onto Kafka, with its id,
// key and payload, signed as orders' relay signed it, as a relay that
// crashed before marking it would.
func republish(brokers []string, id, key string, payload []byte, sign signer) error {
	msg := message.NewMessage(id, payload)
	msg.Metadata.Set(outbox.KeyMetadata, key)
	if sign != nil {
		sign(events.TopicOrders, msg)
	}
	return kafkaconf.PublishOnce(brokers, nil, events.TopicOrders, msg)
}

// progressLine says how far the run is, and, once every paid order is
// settled, what the wait is still for (a capture not yet ended, say).
func progressLine(r judge.Report) string {
	line := fmt.Sprintf("%d of %d paid orders settled", r.Reserved+r.Rejected, r.OrdersPaid)
	if lost, ok := r.Invariant(judge.NothingLost); ok && !lost.OK && r.Reserved+r.Rejected == r.OrdersPaid {
		line += "; still missing: " + lost.Detail
	}
	return line
}

func printReport(r judge.Report, took time.Duration) {
	say("")
	say("what happened (%s):", took.Round(time.Millisecond))
	say("  orders paid:            %d", r.OrdersPaid)
	say("  reserved:               %d", r.Reserved)
	say("  captured, units sold:   %d", r.Ended)
	say("  rejected (no stock):    %d", r.Rejected)
	say("  not settled:            %d", r.Unsettled)
	say("  duplicates suppressed:  %d", r.DuplicatesSuppressed)
	say("  outbox rows pending:    orders %d, inventory %d", r.OutboxPending["orders"], r.OutboxPending["inventory"])
	for k, n := range r.Quarantined {
		say("  quarantined %-12s %d", k+":", n)
	}
	say("")
	for _, inv := range r.Invariants {
		printInvariant(inv)
	}
	say("")
}

func printInvariant(inv judge.Invariant) {
	status := "PASS"
	if !inv.OK {
		status = "FAIL"
	}
	say("  %s  %-19s %s", status, inv.Name, inv.Detail)
}

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }
