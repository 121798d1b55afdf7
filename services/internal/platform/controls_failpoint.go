//go:build failpoint

package platform

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/services/internal/platform/textbook"
)

// checkControls lets a failpoint build run the control runs' switches
// (controls.go refuses them in a default build); Run logs each one it
// honours.
func checkControls(Config) error { return nil }

// withControls applies INBOX_DISABLED to the inbox's config.
func withControls(cfg Config, c inbox.Config) inbox.Config {
	if cfg.InboxDisabled {
		return inbox.WithoutDedupe(c)
	}
	return c
}

// runTextbook runs the benchmark's textbook relay (RELAY_DRIVER=textbook).
func runTextbook(ctx context.Context, pool *pgxpool.Pool, pub message.Publisher, log watermill.LoggerAdapter) error {
	return textbook.Run(ctx, pool, pub, log)
}
