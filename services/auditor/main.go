// Command auditor checks the running system's invariants continuously:
// what the chaos judge proves after a run (answers agree across the
// services, every capture has its sale and every sale its capture, stock
// balances, nothing stuck), examined on the live databases behind a
// watermark (pkg/audit), each breach a finding in its own database, a
// metric, an alert (AuditFindingOpen) and a line on the live page.
//
// It reads the two services' databases (ORDERS_DATABASE_URL,
// INVENTORY_DATABASE_URL: a login that may read is enough) and writes only
// its own (AUDIT_DATABASE_URL). GET /findings lists what is wrong now;
// GET /metrics exports it; GET /healthz answers while it runs.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "auditor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return serve(ctx, cfg)
}
