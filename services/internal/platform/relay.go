package platform

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// newRelayPublisher returns the publisher RELAY_DRIVER asks for.
func newRelayPublisher(cfg Config, service string, marshaler kafka.MarshalerUnmarshaler, log *slog.Logger) (message.Publisher, error) {
	conf := kafkaconf.Sarama()
	conf.ClientID = service + "-relay"
	switch cfg.RelayDriver {
	case "batch":
		return outboxkafka.New(outboxkafka.Config{Brokers: cfg.KafkaBrokers, Sarama: conf, Marshaler: marshaler, Logger: log})
	case "watermill", "textbook":
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{
			Brokers: cfg.KafkaBrokers, Marshaler: marshaler, OverwriteSaramaConfig: conf,
		}, newWatermillLogger(log))
		if err != nil {
			return nil, fmt.Errorf("creating kafka publisher: %w", err)
		}
		return pub, nil
	default:
		return nil, fmt.Errorf("RELAY_DRIVER=%q: want batch, watermill or textbook", cfg.RelayDriver)
	}
}

// runRelay runs the relay RELAY_DRIVER asks for until ctx ends. The
// benchmark's textbook relay is linked into failpoint builds only
// (controls_failpoint.go).
func runRelay(ctx context.Context, cfg Config, relay *outbox.Relay, pool *pgxpool.Pool, pub message.Publisher, log watermill.LoggerAdapter) error {
	if cfg.RelayDriver == "textbook" {
		return runTextbook(ctx, pool, pub, log)
	}
	return relay.Run(ctx)
}

// controlsSet names the control runs' switches cfg has set: each turns a
// guarantee off, or swaps the relay for one the benchmark compares.
func controlsSet(cfg Config) []string {
	var set []string
	for _, c := range []struct {
		on   bool
		name string
	}{
		{cfg.InboxDisabled, "INBOX_DISABLED"},
		{cfg.DomainGuardDisabled, "DOMAIN_GUARD_DISABLED"},
		{cfg.BadDeploy, "BAD_DEPLOY"},
		{cfg.EffectKeysDisabled, "EFFECT_KEYS_DISABLED"},
		{cfg.RelayParallel, "RELAY_PARALLEL"},
		{cfg.RelayDriver != "" && cfg.RelayDriver != "batch", "RELAY_DRIVER=" + cfg.RelayDriver},
	} {
		if c.on {
			set = append(set, c.name)
		}
	}
	return set
}
