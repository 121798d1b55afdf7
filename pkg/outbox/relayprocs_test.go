package outbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// A relay child is this test binary run again as one relay process
// (TestMain hands over to runRelayChild before it starts anything), so that
// TestShardedRelayProcesses can kill relays with a real SIGKILL and pause
// them with SIGSTOP.
const relayChildEnv = "OUTBOX_TEST_RELAY_CHILD"

// relayHeader names, on every message a relay child sends, the child: the
// test tells which process sent what.
const relayHeader = "test_relay"

// runRelayChild runs one sharded relay until SIGTERM, from the environment
// TestShardedRelayProcesses sets.
func runRelayChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	id := os.Getenv(relayChildEnv)
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "relay child %s: %v\n", id, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv("OUTBOX_TEST_DB"))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               strings.Split(os.Getenv("OUTBOX_TEST_BROKERS"), ","),
		Marshaler:             kafka.NewWithPartitioningMarshaler(outbox.PartitionKey),
		OverwriteSaramaConfig: kafkatest.Sarama(),
	}, watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{
		Pool: pool, Publisher: stamping{pub, id}, RelayID: id, Shards: 8,
		LeaseTTL: 600 * time.Millisecond, BatchTimeout: 500 * time.Millisecond,
		BatchSize: 30, PollInterval: 20 * time.Millisecond,
	})
	if err != nil {
		return fail(err)
	}
	if err := relay.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// stamping names the relay child on every message it sends.
type stamping struct {
	message.Publisher
	id string
}

func (p stamping) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		m.Metadata.Set(relayHeader, p.id)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// relayChild is a running relay process.
type relayChild struct {
	id  string
	cmd *exec.Cmd
}

// TestShardedRelayProcesses: three relay processes share an outbox's eight
// shards while producers write many messages per key; relays are killed
// with SIGKILL and new ones started, and one is paused with SIGSTOP past
// its lease and its transaction's idle timeout, then woken. Every row is
// published and marked, each key's first arrivals are in commit order, and
// what the woken zombie sent after it woke are repeats of messages another
// relay had sent: it published nothing new for the shards it lost.
func TestShardedRelayProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts relay processes")
	}
	t.Parallel()
	ctx, bundle := setupRelay(t)
	rng := rand.New(rand.NewPCG(7, 7))
	var children []*relayChild
	start := func() *relayChild {
		c := &relayChild{id: fmt.Sprintf("relay-%d", len(children)+1)}
		c.cmd = exec.Command(os.Args[0], "-test.run=^$")
		c.cmd.Env = append(os.Environ(), relayChildEnv+"="+c.id,
			"OUTBOX_TEST_DB="+bundle.pool.Config().ConnString(),
			"OUTBOX_TEST_BROKERS="+strings.Join(testKafka.Brokers(), ","))
		c.cmd.Stderr = os.Stderr
		require.NoError(t, c.cmd.Start())
		t.Cleanup(func() {
			c.cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck // a paused child must be able to die
			c.cmd.Process.Kill()                  //nolint:errcheck
			c.cmd.Wait()                          //nolint:errcheck
		})
		children = append(children, c)
		return c
	}
	alive := func() []*relayChild {
		var out []*relayChild
		for _, c := range children {
			if c.cmd.ProcessState == nil {
				out = append(out, c)
			}
		}
		return out
	}
	for range 3 {
		start()
	}
	owners := func() map[string]int {
		rows, err := bundle.pool.Query(ctx, `SELECT owner, count(*) FROM outbox_shards WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var o string
			var n int
			require.NoError(t, rows.Scan(&o, &n))
			out[o] = n
		}
		return out
	}
	eventually(t, waitTimeout, func() bool { return len(owners()) == 3 }, "three relay processes did not share the shards")

	written := writeKeyedAsync(t, ctx, bundle, "", 6, 150, 4, 5, nil)

	// While the producers write: SIGKILL a relay and start another, four
	// times, and pause one past its lease, then wake it.
	kills := 0
	var zombie *relayChild
	for step := 0; step < 5; step++ {
		time.Sleep(time.Duration(200+rng.IntN(300)) * time.Millisecond)
		live := alive()
		victim := live[rng.IntN(len(live))]
		if step == 2 {
			zombie = victim
			require.NoError(t, zombie.cmd.Process.Signal(syscall.SIGSTOP))
			start() // the others and this one take its shards once its lease and session are gone
			time.Sleep(2500 * time.Millisecond)
			require.NoError(t, zombie.cmd.Process.Signal(syscall.SIGCONT))
			continue
		}
		require.NoError(t, victim.cmd.Process.Kill()) // SIGKILL
		victim.cmd.Wait()                             //nolint:errcheck // killed
		kills++
		start()
	}
	want := <-written
	bundle.sink.WaitFor(t, want)
	eventually(t, waitTimeout, func() bool { return countRows(t, bundle.pool, "published_at IS NULL") == 0 },
		"rows still unmarked after their messages reached Kafka")

	// Each key's first arrivals in commit order, whoever sent them: the
	// repeats a killed relay's successor and the woken zombie sent aside.
	records := bundle.sink.Records()
	require.Len(t, requireKeyOrder(t, records), 6*5)
	sentBy := map[string]int{}
	for _, r := range records {
		sentBy[header(r, relayHeader)]++
	}
	t.Logf("%d rows, %d records (%d repeats), %d SIGKILLs, zombie %s paused 2.5s; records per relay %v",
		len(want), len(records), len(records)-len(want), kills, zombie.id, sentBy)
	require.Equal(t, 4, kills)
	require.GreaterOrEqual(t, len(sentBy), 4, "the work moved between relays: %v", sentBy)
	// The zombie, woken, takes part again: it renews nothing (its tokens
	// moved on) and takes a fair share anew.
	eventually(t, waitTimeout, func() bool { return owners()[zombie.id] > 0 }, "the woken relay never took a shard again")
}
