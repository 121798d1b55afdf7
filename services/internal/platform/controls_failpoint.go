//go:build failpoint

package platform

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
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

// withBadDeploy makes fn refuse every message for good when BAD_DEPLOY is
// set, as a bad deploy's handler would: the inbox dead-letters each, its id
// in the reason (a batch refused whole is split down to each message).
func withBadDeploy(cfg Config, fn inbox.BatchFunc) inbox.BatchFunc {
	if !cfg.BadDeploy {
		return fn
	}
	return func(_ context.Context, _ pgx.Tx, msgs []*message.Message) error {
		return inbox.Permanent(fmt.Errorf("bad deploy (BAD_DEPLOY): this build cannot apply %s %s",
			msgs[0].Metadata.Get(outbox.TypeMetadata), msgs[0].UUID))
	}
}

// runTextbook runs the benchmark's textbook relay (RELAY_DRIVER=textbook).
func runTextbook(ctx context.Context, pool *pgxpool.Pool, pub message.Publisher, log watermill.LoggerAdapter) error {
	return textbook.Run(ctx, pool, pub, log)
}
