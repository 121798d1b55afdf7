// Command orders is the example order service: an HTTP API to create, pay
// and read orders, an outbox that announces OrderPaid, and an inbox-guarded
// consumer of the inventory's answers.
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
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := platform.LoadConfig("127.0.0.1:8081")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return platform.Run(ctx, cfg, Service())
}
