package platform

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// TestRunRefusesRetentionKafkaOutlasts: a service whose INBOX_RETENTION is
// shorter than its topic's retention stops, with both numbers in the error,
// and sweeps nothing meanwhile.
func TestRunRefusesRetentionKafkaOutlasts(t *testing.T) {
	t.Parallel()
	ctx, cfg, svc := serviceOnItsOwnTopic(t, "retention")
	require.NoError(t, kfk.CreateTopicsWithConfig(ctx, 1, map[string]string{"retention.ms": fmt.Sprint((240 * time.Hour).Milliseconds())}, svc.Topic))
	cfg.InboxRetention = 96 * time.Hour
	err := Run(ctx, cfg, svc)
	require.ErrorIs(t, err, inboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "INBOX_RETENTION")
	require.ErrorContains(t, err, "Config.Retention=96h0m0s")
}

// TestRunRefusesRelayRetentionKafkaOutlasts: a service whose RELAY_RETENTION
// is shorter than Kafka keeps the topics it publishes to stops, with both
// numbers in the error: a record Kafka deleted under a consumer that was
// down could no longer be sent again from its outbox row.
func TestRunRefusesRelayRetentionKafkaOutlasts(t *testing.T) {
	t.Parallel()
	ctx, cfg, svc := serviceOnItsOwnTopic(t, "relayret")
	cfg.RelayRetention = time.Hour // the relay's default until this check
	err := Run(ctx, cfg, svc)
	require.ErrorIs(t, err, outboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "RELAY_RETENTION")
	require.ErrorContains(t, err, "RelayConfig.Retention=1h0m0s")
	require.ErrorContains(t, err, svc.Name+".events")
}

// serviceOnItsOwnTopic returns a service named prefix-<random>, consuming
// the topic of its name, on a database of its own and a free address, and
// a context that ends within a minute.
func serviceOnItsOwnTopic(t *testing.T, prefix string) (context.Context, Config, Service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	name := prefix + "-" + strings.ToLower(watermill.NewShortUUID()[:6])
	url, err := pg.CreateDatabase(ctx, strings.ReplaceAll(name, "-", "_"))
	require.NoError(t, err)
	addr, err := procs.FreeAddr()
	require.NoError(t, err)
	cfg := defaults
	cfg.DatabaseURL, cfg.HTTPAddr, cfg.Instance = url, addr, name
	return ctx, cfg, Service{
		Name: name, Topic: name, Migrations: fstest.MapFS{},
		Routes: func(*http.ServeMux, DB, Config) {},
		Apply:  always(func(context.Context, pgx.Tx, []*message.Message) error { return nil }),
	}
}

// TestRunRefusesExposureWithoutToken: a service whose HTTP_ADDR is beyond
// loopback refuses to start without HTTP_TOKEN, naming both, before it
// touches anything; with the token, or on loopback, it gets past that.
func TestRunRefusesExposureWithoutToken(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0"} {
		cfg := defaults
		cfg.DatabaseURL, cfg.HTTPAddr, cfg.Instance = "postgres://nowhere.invalid/x", addr, "exposed"
		err := Run(t.Context(), cfg, Service{Name: "exposed", Topic: "exposed"})
		require.ErrorContains(t, err, "HTTP_TOKEN", addr)
		require.ErrorContains(t, err, fmt.Sprintf("HTTP_ADDR %q listens beyond loopback", addr))
	}
	cfg := defaults
	cfg.DatabaseURL, cfg.HTTPAddr, cfg.HTTPToken = "postgres://nowhere.invalid/x", ":0", "token"
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := Run(ctx, cfg, Service{Name: "exposed", Topic: "exposed"})
	require.Error(t, err, "the database does not exist")
	require.NotContains(t, err.Error(), "HTTP_TOKEN", "with a token, exposure is allowed")
}
