package inboxkafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
)

// newAdmin starts an in-process Kafka-protocol broker (kfake) for t and
// returns an admin client on it.
func newAdmin(t *testing.T) sarama.ClusterAdmin {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	admin, err := sarama.NewClusterAdmin(cluster.ListenAddrs(), conf)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	return admin
}

// TestCheckRetention: the inbox reads how long Kafka keeps its topics and
// refuses a retention the topics outlast. Before it, Validate compared
// Retention with RedeliveryHorizon, two numbers the user typed: a 7-day
// Retention against a 3-day horizon passed while Kafka's defaults keep a
// record up to 14 days, and a group whose offsets expired would replay it
// after its inbox row was swept.
func TestCheckRetention(t *testing.T) {
	t.Parallel()
	admin := newAdmin(t)
	topic := func(config map[string]string) string {
		name := "retention-" + strings.ToLower(watermill.NewShortUUID())
		entries := map[string]*string{}
		for k, v := range config {
			entries[k] = &v
		}
		require.NoError(t, admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: entries}, false))
		return name
	}
	const day = 24 * time.Hour
	twoDays := topic(map[string]string{"retention.ms": "172800000", "segment.ms": "86400000"})
	defaults := topic(nil)
	forever := topic(map[string]string{"retention.ms": "-1"})
	check := func(retention time.Duration, topics ...string) (inboxkafka.Retention, error) {
		return inboxkafka.CheckRetention(admin, retention, topics...)
	}

	// 2 days + a 1-day segment + the check interval: 3 days is short.
	k, err := check(3*day, twoDays)
	require.ErrorIs(t, err, inboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "Config.Retention=72h0m0s")
	require.ErrorContains(t, err, twoDays)
	horizon, _, _ := k.Horizon()
	require.Equal(t, 3*day+k.CheckInterval, horizon)
	require.Equal(t, 7*day, k.OffsetsRetention, "Kafka's default offsets.retention.minutes")
	_, err = check(4*day, twoDays)
	require.NoError(t, err)

	// Kafka's defaults keep a record up to 7 + 7 days: a week of inbox is
	// short; the library's default Retention covers them.
	_, err = check(7*day, twoDays, defaults)
	require.ErrorIs(t, err, inboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, defaults, "the topic that sets the horizon is named")
	_, err = check(inbox.DefaultRetention, twoDays, defaults)
	require.NoError(t, err, "the default Retention must cover Kafka's default topic")

	// A topic not created yet will get the brokers' defaults.
	missing := "retention-missing-" + strings.ToLower(watermill.NewShortUUID())
	k, err = check(7*day, missing)
	require.ErrorIs(t, err, inboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "not created yet")
	require.Equal(t, 7*day, k.Topics[0].Retention)
	require.Equal(t, 7*day, k.Topics[0].Segment)

	_, err = check(365*day, forever)
	require.ErrorIs(t, err, inboxkafka.ErrRetentionTooShort)
	require.ErrorContains(t, err, "retention.ms=-1")
}
