package outboxkafka_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

func TestIsPermanent(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("broker down"), false},
		{sarama.ErrNotLeaderForPartition, false},
		{fmt.Errorf("producing: %w", sarama.ErrMessageSizeTooLarge), true},
		{sarama.ErrInvalidRecord, true},
		{outbox.Permanent(errors.New("no")), true},
		{sarama.ProducerErrors{{Err: sarama.ErrRequestTimedOut}}, false},
		{fmt.Errorf("batch: %w", sarama.ProducerErrors{{Err: sarama.ErrRequestTimedOut}, {Err: sarama.ErrMessageSetSizeTooLarge}}), true},
	} {
		if got := outboxkafka.IsPermanent(c.err); got != c.want {
			t.Errorf("IsPermanent(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestNewPublisherLeavesTheConfigAlone: the publisher needs successes
// returned and one request in flight; it sets them on its own copy, not on
// the caller's config, which may be shared.
func TestNewPublisherLeavesTheConfigAlone(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	conf.Producer.Return.Successes = false
	conf.Net.MaxOpenRequests = 5
	pub, err := outboxkafka.NewPublisher(cluster.ListenAddrs(), conf, kafka.DefaultMarshaler{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() }) //nolint:errcheck
	if conf.Producer.Return.Successes || conf.Net.MaxOpenRequests != 5 {
		t.Fatalf("NewPublisher changed the caller's config: Return.Successes %v, MaxOpenRequests %d",
			conf.Producer.Return.Successes, conf.Net.MaxOpenRequests)
	}
}
