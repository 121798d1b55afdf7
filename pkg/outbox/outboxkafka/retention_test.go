package outboxkafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// TestCheckRetention: the relay keeps a published row as long as Kafka can
// keep its record, so a record Kafka deletes under a consumer that was
// down can still be sent again. The relay's default Retention was an hour
// while Kafka's default topic keeps a record up to 14 days: a consumer down
// for two hours lost records nothing could send again.
func TestCheckRetention(t *testing.T) {
	t.Parallel()
	kfk, err := kafkatest.Start(t.Context(), kafkatest.Options{})
	require.NoError(t, err)
	t.Cleanup(kfk.Close)
	admin, err := sarama.NewClusterAdmin(kfk.Brokers(), kafkatest.Sarama())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	topic := func(config map[string]string) string {
		name := "retention-" + strings.ToLower(watermill.NewShortUUID())
		require.NoError(t, kfk.CreateTopicsWithConfig(t.Context(), 1, config, name))
		return name
	}
	const day = 24 * time.Hour
	twoDays := topic(map[string]string{"retention.ms": "172800000", "segment.ms": "86400000"})
	defaults := topic(nil)
	forever := topic(map[string]string{"retention.ms": "-1"})

	// 2 days + a 1-day segment + the check interval (5 minutes): 3 days is short.
	horizon, _, err := outboxkafka.CheckRetention(admin, 3*day, twoDays)
	require.ErrorIs(t, err, outboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "RelayConfig.Retention=72h0m0s")
	require.ErrorContains(t, err, twoDays)
	require.Equal(t, 3*day+5*time.Minute, horizon)
	_, _, err = outboxkafka.CheckRetention(admin, 4*day, twoDays)
	require.NoError(t, err)

	// The topic that keeps records longest sets the horizon; the library's
	// default Retention covers Kafka's default topic configs.
	_, _, err = outboxkafka.CheckRetention(admin, 7*day, twoDays, defaults)
	require.ErrorIs(t, err, outboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, defaults)
	_, _, err = outboxkafka.CheckRetention(admin, outbox.DefaultRetention, twoDays, defaults)
	require.NoError(t, err, "the default Retention must cover Kafka's default topic")

	// A topic not created yet will get the brokers' defaults.
	missing := "retention-missing-" + strings.ToLower(watermill.NewShortUUID())
	_, _, err = outboxkafka.CheckRetention(admin, time.Hour, missing)
	require.ErrorIs(t, err, outboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "not created yet")

	// A topic that never deletes by age loses nothing to retention, and
	// sets no horizon: the others beside it still do.
	_, everKept, err := outboxkafka.CheckRetention(admin, time.Hour, forever)
	require.NoError(t, err)
	require.True(t, everKept)
	_, everKept, err = outboxkafka.CheckRetention(admin, time.Hour, forever, twoDays)
	require.ErrorIs(t, err, outboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, twoDays)
	require.True(t, everKept)
}
