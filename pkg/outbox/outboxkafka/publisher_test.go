package outboxkafka_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
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

// TestNewLeavesTheConfigAlone: the publisher needs successes
// returned and one request in flight; it sets them on its own copy, not on
// the caller's config, which may be shared.
func TestNewLeavesTheConfigAlone(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	conf.Producer.Return.Successes = false
	conf.Net.MaxOpenRequests = 5
	pub, err := outboxkafka.New(outboxkafka.Config{Brokers: cluster.ListenAddrs(), Sarama: conf, Marshaler: kafka.DefaultMarshaler{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() }) //nolint:errcheck
	if conf.Producer.Return.Successes || conf.Net.MaxOpenRequests != 5 {
		t.Fatalf("New changed the caller's config: Return.Successes %v, MaxOpenRequests %d",
			conf.Producer.Return.Successes, conf.Net.MaxOpenRequests)
	}
}

// TestKeyOrderThroughFailedRequests: the broker refuses the first produce
// requests (a leader moving, a broker restarting) for longer than Sarama's
// default retries last. Sarama then fails the messages of the refused
// request but sends the later messages of the same partition, which the
// broker takes: Kafka would hold message 1 before message 0, and the
// relay's retry of the batch could not put 0 back in front (Sarama issue
// 2619: MaxOpenRequests = 1 is not enough). The publisher must keep a key's
// first copies in the order of the batch.
func TestKeyOrderThroughFailedRequests(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("reset=%t", reset), func(t *testing.T) { keyOrderThroughFailedRequests(t, reset) })
	}
}

func keyOrderThroughFailedRequests(t *testing.T, resetConn bool) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "ordered"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var refused atomic.Int32
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		n := 0
		for _, rt := range r.Topics {
			for _, rp := range rt.Partitions {
				if b, err := kgoRecords(rp.Records); err == nil {
					n += b
				}
			}
		}
		t.Logf("produce request %d: %d records", refused.Load()+1, n)
		if refused.Add(1) > 4 { // Sarama's default: 3 retries
			return nil, nil, false
		}
		if resetConn {
			return nil, errors.New("connection reset"), true
		}
		return kafkatest.RefuseProduce(r, kerr.NotLeaderForPartition.Code), nil, true
	})
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	conf.Producer.RequiredAcks = sarama.WaitForAll
	conf.Producer.Retry.Backoff = 10 * time.Millisecond
	conf.Metadata.Retry.Backoff = 10 * time.Millisecond
	pub, err := outboxkafka.New(outboxkafka.Config{Brokers: cluster.ListenAddrs(), Sarama: conf, Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() }) //nolint:errcheck
	var msgs []*message.Message
	for i := range 40 {
		m := message.NewMessage(fmt.Sprint(i), []byte(fmt.Sprint(i)))
		m.Metadata.Set(outbox.KeyMetadata, "one-key")
		msgs = append(msgs, m)
	}
	for attempt := 1; ; attempt++ { // as the relay does: the whole batch again
		if err = pub.Publish("ordered", msgs...); err == nil {
			break
		}
		t.Logf("attempt %d: %v", attempt, err)
		if attempt == 5 {
			t.Fatal("the batch never went through")
		}
	}

	consumer, err := sarama.NewConsumer(cluster.ListenAddrs(), conf)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	pc, err := consumer.ConsumePartition("ordered", 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	seen := map[string]bool{}
	var first []string
	for len(seen) < len(msgs) {
		select {
		case rec := <-pc.Messages():
			if v := string(rec.Value); !seen[v] {
				seen[v] = true
				first = append(first, v)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d messages in Kafka: %v", len(seen), len(msgs), first)
		}
	}
	for i, v := range first {
		if v != fmt.Sprint(i) {
			t.Fatalf("first copies out of order at %d: %v", i, first)
		}
	}
}

// kgoRecords counts the records of a record batch.
func kgoRecords(raw []byte) (int, error) {
	var b kmsg.RecordBatch
	if err := b.ReadFrom(raw); err != nil {
		return 0, err
	}
	return int(b.NumRecords), nil
}

// TestABatchIsOneProduceRequest: a Publish call's messages leave in one
// produce request, not the first alone and the rest after it: 20 batches of
// 30 messages over 4 partitions of one broker. Without a window Sarama
// sends a batch's first message alone and the rest when that returns: 40
// requests at least. The default window (FlushWindow, 1 ms) gathers a
// batch, but a goroutine descheduled for a millisecond while it hands the
// batch over splits it, which a busy make test did to 10 batches of 20: so
// the default is held to fewer than 40, and a window the caller sets, long
// beside any hiccup, to one request a batch. A caller's own Flush settings
// are kept (Flush.Messages = 1: a request a message).
func TestABatchIsOneProduceRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		messages  int           // Producer.Flush.Messages
		frequency time.Duration // Producer.Flush.Frequency; with messages 0: the publisher's window
		most      int           // requests allowed for the 20 batches
		least     int
	}{
		{"default window", 0, 0, 39, 20},
		{"a window the caller sets", 0, 200 * time.Millisecond, 21, 20},
		{"the caller's flush settings", 1, 0, 1 << 30, 21},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "batched"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			var requests, records atomic.Int32
			cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				cluster.KeepControl()
				requests.Add(1)
				for _, rt := range req.(*kmsg.ProduceRequest).Topics {
					for _, rp := range rt.Partitions {
						if n, err := kgoRecords(rp.Records); err == nil {
							records.Add(int32(n))
						}
					}
				}
				return nil, nil, false
			})
			conf := sarama.NewConfig()
			conf.Version = sarama.V2_8_0_0
			conf.Producer.RequiredAcks = sarama.WaitForAll
			conf.Producer.Flush.Messages = tc.messages
			conf.Producer.Flush.Frequency = tc.frequency
			pub, err := outboxkafka.New(outboxkafka.Config{Brokers: cluster.ListenAddrs(), Sarama: conf, Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pub.Close() }) //nolint:errcheck
			for b := range 20 {
				var msgs []*message.Message
				for i := range 30 {
					m := message.NewMessage(fmt.Sprintf("%d-%d", b, i), []byte("x"))
					m.Metadata.Set(outbox.KeyMetadata, fmt.Sprint("key-", i))
					msgs = append(msgs, m)
				}
				if err := pub.Publish("batched", msgs...); err != nil {
					t.Fatal(err)
				}
			}
			if got := records.Load(); got != 600 {
				t.Fatalf("the broker got %d records, want 600", got)
			}
			t.Logf("%d requests", requests.Load())
			if n := int(requests.Load()); n < tc.least || n > tc.most {
				t.Fatalf("20 batches took %d produce requests, want %d to %d", n, tc.least, tc.most)
			}
		})
	}
}
