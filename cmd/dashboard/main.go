// Command dashboard serves a live page of the example system: the flow drawn
// from outbox to Kafka to inbox and back, one order's journey, orders by
// status, each service's outbox backlog and oldest pending row, duplicates
// suppressed, quarantined and dead-lettered messages with their reasons, and
// the kills and invariants of a chaos run. It reads the two services'
// databases directly (see dashboard).
//
//	ORDERS_DATABASE_URL=postgres://... INVENTORY_DATABASE_URL=postgres://... dashboard -addr :8090
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/dashboard"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	addr := fs.String("addr", envOr("DASHBOARD_ADDR", "127.0.0.1:8090"), "listen address (DASHBOARD_ADDR)")
	ordersURL := fs.String("orders-db", os.Getenv("ORDERS_DATABASE_URL"), "the orders service's database (ORDERS_DATABASE_URL)")
	inventoryURL := fs.String("inventory-db", os.Getenv("INVENTORY_DATABASE_URL"), "the inventory service's database (INVENTORY_DATABASE_URL)")
	chaos := fs.String("chaos-status", os.Getenv("CHAOS_STATUS"), "a chaos run's JSON status or report file (CHAOS_STATUS); optional")
	brokers := fs.String("kafka", os.Getenv("KAFKA_BROKERS"), "Kafka brokers, comma-separated, for the topics' partitions on the picture (KAFKA_BROKERS); optional")
	traceURL := fs.String("trace-url", os.Getenv("DASHBOARD_TRACE_URL"), "a tracing UI's trace page, {trace_id} replaced, linked from a followed order (DASHBOARD_TRACE_URL); optional")
	auditURL := fs.String("audit-db", os.Getenv("AUDIT_DATABASE_URL"), "the auditor's database, for the page's \"what is wrong now\" (AUDIT_DATABASE_URL); optional")
	interval := fs.Duration("interval", time.Second, "how often the page updates")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ordersURL == "" || *inventoryURL == "" {
		return errors.New("ORDERS_DATABASE_URL and INVENTORY_DATABASE_URL (or -orders-db and -inventory-db) are required")
	}
	orders, err := pgxpool.New(ctx, *ordersURL)
	if err != nil {
		return fmt.Errorf("orders database: %w", err)
	}
	defer orders.Close()
	inventory, err := pgxpool.New(ctx, *inventoryURL)
	if err != nil {
		return fmt.Errorf("inventory database: %w", err)
	}
	defer inventory.Close()

	opts := dashboard.Options{
		Orders: orders, Inventory: inventory, ChaosStatus: *chaos, Interval: *interval,
		Brokers: splitList(*brokers), TraceURL: *traceURL,
	}
	if *auditURL != "" {
		if opts.Audit, err = pgxpool.New(ctx, *auditURL); err != nil {
			return fmt.Errorf("the auditor's database: %w", err)
		}
		defer opts.Audit.Close()
	}
	url, err := dashboard.Start(ctx, *addr, opts)
	if err != nil {
		return err
	}
	fmt.Println("dashboard:", url)
	<-ctx.Done()
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
