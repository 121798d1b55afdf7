// Command inventory is the example stock service: it consumes OrderPaid
// through the inbox, reserves stock (or rejects the order) and announces the
// result through the outbox, all in one transaction. HTTP seeds and reads
// stock.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := platform.LoadConfig("127.0.0.1:8082")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return platform.Run(ctx, cfg, Service())
}
