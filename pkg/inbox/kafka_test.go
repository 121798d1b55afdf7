package inbox_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/internal/kafkaconf"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
)

// TestCheckKafka: the inbox reads how long Kafka keeps its topics and
// refuses a retention the topics outlast. Before it, Validate compared
// Retention with RedeliveryHorizon, two numbers the user typed: a 7-day
// Retention against a 3-day horizon passed while Kafka's defaults keep a
// record up to 14 days, and a group whose offsets expired would replay it
// after its inbox row was swept.
func TestCheckKafka(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin, err := sarama.NewClusterAdmin(kfk.DirectBrokers(), kafkaconf.Sarama())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })

	topic := func(config map[string]string) string {
		name := "retention-" + strings.ToLower(watermill.NewShortUUID())
		require.NoError(t, kfk.CreateTopicsWithConfig(ctx, 1, config, name))
		return name
	}
	const day = 24 * time.Hour
	twoDays := topic(map[string]string{"retention.ms": "172800000", "segment.ms": "86400000"})
	defaults := topic(nil)
	forever := topic(map[string]string{"retention.ms": "-1"})

	pool, err := pgxpool.New(ctx, pg.URL("postgres")) // New runs no query
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	newInbox := func(retention time.Duration) *inbox.Inbox {
		in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "c", Retention: retention, RedeliveryHorizon: day})
		require.NoError(t, err, "Validate alone accepts it")
		return in
	}

	// 2 days + a 1-day segment + the check interval: 3 days is short.
	k, err := newInbox(3*day).CheckKafka(admin, twoDays)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, "Config.Retention=72h0m0s")
	require.ErrorContains(t, err, twoDays)
	horizon, _, _ := k.Horizon()
	require.Equal(t, 3*day+k.CheckInterval, horizon)
	require.Equal(t, 7*day, k.OffsetsRetention, "Kafka's default offsets.retention.minutes")
	_, err = newInbox(4*day).CheckKafka(admin, twoDays)
	require.NoError(t, err)

	// Kafka's defaults keep a record up to 7 + 7 days: a week of inbox is
	// short; the library's default Retention covers them.
	_, err = newInbox(7*day).CheckKafka(admin, twoDays, defaults)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, defaults, "the topic that sets the horizon is named")
	_, err = newInbox(0).CheckKafka(admin, twoDays, defaults)
	require.NoError(t, err, "the default Retention must cover Kafka's default topic")

	// A topic not created yet will get the brokers' defaults.
	missing := "retention-missing-" + strings.ToLower(watermill.NewShortUUID())
	k, err = newInbox(7*day).CheckKafka(admin, missing)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, "not created yet")
	require.Equal(t, 7*day, k.Topics[0].Retention)
	require.Equal(t, 7*day, k.Topics[0].Segment)

	_, err = newInbox(365*day).CheckKafka(admin, forever)
	require.ErrorIs(t, err, inbox.ErrRetentionTooShort)
	require.ErrorContains(t, err, "retention.ms=-1")
}
