// Command provider is the payment provider stand-in (chaos/provider):
// POST /v1/captures and /v1/refunds with Stripe-like idempotent requests over a ledger in
// its own Postgres database, with injected latency, 500s and lost
// responses, configured from the environment (PROVIDER_*).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outbox-inbox/chaos/provider"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := provider.LoadConfig()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return provider.Run(ctx, cfg)
}
