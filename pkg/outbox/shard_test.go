package outbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// shardedConfig is a sharded relay's config for the tests: short leases,
// so shards move within a test.
func shardedConfig(bundle *relayBundle, pub message.Publisher, id string) outbox.RelayConfig {
	return outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, Shards: 8, LeaseTTL: 300 * time.Millisecond,
		RelayID: id, BatchSize: 40, PollInterval: 20 * time.Millisecond}
}

// TestShardedRelays: relays that share an outbox's shards all publish, each
// key's messages reach Kafka in commit order across handovers (replicas
// stopped and added mid-run), and a relay that lost its shards (a zombie,
// paused past its lease, between batches or inside one) claims and marks
// nothing of them again.
func TestShardedRelays(t *testing.T) {
	t.Parallel()

	t.Run("SpreadInKeyOrderAcrossHandovers", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		var relays []*outbox.Relay
		var runs []*running
		start := func(id string) {
			r := newRelay(t, shardedConfig(bundle, newPublisher(t), id))
			relays, runs = append(relays, r), append(runs, startRelay(t, r))
		}
		for _, id := range []string{"a", "b", "c"} {
			start(id)
		}
		// Three relays share the eight shards: ceil(8/3) = 3 at most each.
		eventually(t, waitTimeout, func() bool {
			total := 0
			for _, r := range relays {
				n := r.Stats().Shards
				if n == 0 || n > 3 {
					return false
				}
				total += n
			}
			return total == 8
		}, "three relays did not share the eight shards")

		// Producers write half their rows; one relay stops (its shards
		// move to the others) and a fourth starts (shards move to it); they
		// write the other half, the same keys.
		halfway := make(chan struct{})
		written := writeKeyedAsync(t, ctx, bundle, "", 6, 40, 4, 6, halfway)
		eventually(t, waitTimeout, func() bool { return bundle.sink.Len() >= 6*20*4/2 }, "the first rows never reached Kafka")
		runs[0].Stop(t)
		start("d")
		eventually(t, waitTimeout, func() bool { return relays[3].Stats().Shards > 0 }, "the new relay took no shard")
		close(halfway)
		want := <-written

		bundle.sink.WaitFor(t, want)
		eventually(t, waitTimeout, func() bool { return countRows(t, bundle.pool, "published_at IS NULL") == 0 },
			"rows still unmarked after their messages reached Kafka")
		// A relay counts a batch after its commit returns: the last batches'
		// counts may trail the marks by a moment (a make test run read them
		// 12 short).
		stats := func() (published int64, perRelay []int64) {
			for _, r := range relays {
				s := r.Stats()
				published += s.Published
				perRelay = append(perRelay, s.Published)
			}
			return published, perRelay
		}
		eventually(t, waitTimeout, func() bool { n, _ := stats(); return n >= int64(len(want)) }, "the relays' counts never reached the rows marked")
		published, perRelay := stats()
		records := bundle.sink.Records()
		t.Logf("%d rows, %d records, published per relay %v", len(want), len(records), perRelay)
		require.Equal(t, int64(len(want)), published, "a row was marked by two relays")
		for i, n := range perRelay[1:] {
			require.NotZero(t, n, "relay %d published nothing: the shards were not shared", i+1)
		}
		require.Len(t, requireKeyOrder(t, records), 6*6)
	})

	// A relay paused between batches past its lease wakes up with the
	// shards it held in memory. A replacement under the same id (a
	// restarted pod with a stable name) took them: the owner is the same,
	// but the tokens have moved on, so the zombie claims nothing, while the
	// replacement publishes everything.
	t.Run("ZombieBetweenBatches", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		var zombieSent atomic.Int64
		zombie := newRelay(t, shardedConfig(bundle, countingPublisher{bundle.pub, &zombieSent}, "replica-1"))
		publishCommitted(t, bundle.pool, bundle.topic, newKeyedMessage("k", 0))
		n, err := zombie.RelayOnce(ctx) // takes all eight shards (it is alone) and publishes
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, 8, zombie.Stats().Shards)

		time.Sleep(2 * 300 * time.Millisecond) // paused: its leases expire
		live := newRelay(t, shardedConfig(bundle, newPublisher(t), "replica-1"))
		startRelay(t, live)
		eventually(t, waitTimeout, func() bool { return live.Stats().Shards == 8 }, "the replacement did not take the expired shards")
		var msgs []*message.Message
		for i := 1; i <= 20; i++ {
			msgs = append(msgs, newKeyedMessage("k", i))
		}
		// The zombie wakes while the rows are there to take.
		publishCommitted(t, bundle.pool, bundle.topic, msgs...)
		n, err = zombie.RelayOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the zombie claimed rows of shards it lost")
		require.Equal(t, int64(1), zombieSent.Load(), "the zombie published after it lost its shards")
		bundle.sink.WaitFor(t, append([]string{}, ids(msgs)...))
		requireKeyOrder(t, bundle.sink.Records())
	})

	// A relay paused inside a batch, between its claim and its send, past
	// its lease and its transaction's idle timeout: Postgres ends its
	// session, so the relay that takes the shard publishes the rows again;
	// the zombie, woken, sends only those repeats, and its marks never
	// commit.
	t.Run("ZombieInsideBatch", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		gate := newGatedPublisher(bundle.pub)
		t.Cleanup(gate.Release)
		cfg := shardedConfig(bundle, gate, "zombie")
		cfg.BatchTimeout = 300 * time.Millisecond // its session ends 1.3s after its last statement
		zombie := newRelay(t, cfg)
		first := []*message.Message{newKeyedMessage("k", 0), newKeyedMessage("k", 1)}
		publishCommitted(t, bundle.pool, bundle.topic, first...)
		zombieDone := make(chan error, 1)
		go func() { _, err := zombie.RelayOnce(ctx); zombieDone <- err }()
		gate.WaitEntered(t) // claimed, blocked in its send

		// The live relay's publisher returns a moment after Kafka has its
		// records, as on a busy machine: the test must wait for its marks,
		// not read them as soon as the records arrive.
		live := newRelay(t, shardedConfig(bundle, lingeringPublisher{newPublisher(t), 300 * time.Millisecond}, "live"))
		startRelay(t, live)
		later := []*message.Message{newKeyedMessage("k", 2), newKeyedMessage("k", 3)}
		publishCommitted(t, bundle.pool, bundle.topic, later...)
		bundle.sink.WaitFor(t, ids(append(first, later...)))
		before := len(bundle.sink.Records())

		gate.Release() // the zombie wakes and sends its claimed rows
		select {
		case err := <-zombieDone:
			require.Error(t, err, "the zombie's marks committed: its session should be gone")
		case <-time.After(waitTimeout):
			t.Fatal("the zombie's batch never ended")
		}
		require.Zero(t, zombie.Stats().Published)
		records := bundle.sink.Records()
		seen := map[string]bool{}
		for i, r := range records {
			if i >= before {
				require.True(t, seen[messageID(r)], "the zombie sent %s, which no live relay had sent: only repeats may follow a lost lease", messageID(r))
			}
			seen[messageID(r)] = true
		}
		requireKeyOrder(t, records)
		// The live relay marks its batch after Kafka acknowledged it: its
		// records can be in the sink a moment before its marks commit (a
		// busy make test read all four unmarked).
		eventually(t, waitTimeout, func() bool { return countRows(t, bundle.pool, "published_at IS NULL") == 0 },
			"rows still unmarked after the live relay published them")
	})

	// The shard count can change once no relay runs; a paused relay that
	// wakes after the table was rebuilt for another count (under the same
	// RelayID) claims nothing: the rebuilt leases carry the count and tokens
	// above every earlier one.
	t.Run("ShardCountChange", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		cfg := shardedConfig(bundle, bundle.pub, "replica-1")
		cfg.Shards = 2
		var zombieSent atomic.Int64
		cfg.Publisher = countingPublisher{bundle.pub, &zombieSent}
		zombie := newRelay(t, cfg)
		publishCommitted(t, bundle.pool, bundle.topic, newKeyedMessage("k", 0))
		n, err := zombie.RelayOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		time.Sleep(2 * 300 * time.Millisecond)                                          // the zombie is paused: its heartbeat and leases expire
		replacement := newRelay(t, shardedConfig(bundle, newPublisher(t), "replica-1")) // 8 shards, the zombie's id
		startRelay(t, replacement)
		eventually(t, waitTimeout, func() bool { return replacement.Stats().Shards == 8 }, "the replacement did not rebuild and take the shards")
		var msgs []*message.Message
		for i := 1; i <= 40; i++ {
			msgs = append(msgs, newKeyedMessage(fmt.Sprintf("k%d", i%7), i))
		}
		publishCommitted(t, bundle.pool, bundle.topic, msgs...)
		n, err = zombie.RelayOnce(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the zombie claimed rows with the count and tokens of a table that was rebuilt")
		require.Equal(t, int64(1), zombieSent.Load())
		bundle.sink.WaitFor(t, ids(msgs))
	})

	// A relay configured with another count than a running one's refuses
	// to run.
	t.Run("ShardCountRefused", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		cfg := shardedConfig(bundle, bundle.pub, "two")
		cfg.Shards, cfg.LeaseTTL = 2, 10*time.Second // alive for the whole test, however slow the machine
		two := newRelay(t, cfg)
		startRelay(t, two)
		eventually(t, waitTimeout, func() bool { return two.Stats().Shards == 2 }, "the relay with 2 shards took none")
		runCtx, cancel := context.WithTimeout(ctx, waitTimeout)
		defer cancel()
		eight := newRelay(t, shardedConfig(bundle, newPublisher(t), "eight"))
		require.ErrorIs(t, eight.Run(runCtx), outbox.ErrShardCount, "a relay with 8 shards beside a live one with 2")
	})

	// A relay woken from a pause gives back nothing a replacement under
	// its RelayID took meanwhile.
	t.Run("ZombieGivesBackNothing", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		zombie := newRelay(t, shardedConfig(bundle, bundle.pub, "replica-1"))
		_, err := zombie.RelayOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 8, zombie.Stats().Shards)
		time.Sleep(2 * 300 * time.Millisecond)
		replacement := newRelay(t, shardedConfig(bundle, newPublisher(t), "replica-1"))
		startRelay(t, replacement)
		eventually(t, waitTimeout, func() bool { return replacement.Stats().Shards == 8 }, "the replacement did not take the shards")

		stopped, cancel := context.WithCancel(ctx)
		cancel() // SIGTERM arrived while it was paused: it wakes up shutting down
		require.NoError(t, zombie.Run(stopped))
		require.Equal(t, 8, countShardsOwnedBy(t, bundle, "replica-1"), "the zombie gave back the replacement's shards")
	})

	t.Run("ConfigRefused", func(t *testing.T) {
		t.Parallel()
		_, bundle := setupRelay(t)
		for _, cfg := range []outbox.RelayConfig{
			{Shards: -1}, {Shards: 5000}, {Shards: 4, Parallel: true}, {Shards: 4, LeaseTTL: time.Millisecond},
		} {
			cfg.Pool, cfg.Publisher = bundle.pool, bundle.pub
			_, err := outbox.NewRelay(cfg)
			require.Error(t, err, "%+v", cfg)
		}
	})
}

// countShardsOwnedBy counts the leases that name owner, expired or not (a
// renewal late on a loaded machine lets one expire for a moment; a lease
// given back has no owner).
func countShardsOwnedBy(t *testing.T, bundle *relayBundle, owner string) int {
	t.Helper()
	var n int
	require.NoError(t, bundle.pool.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox_shards WHERE owner = $1`, owner).Scan(&n))
	return n
}

// countingPublisher counts the messages it passes on.
// lingeringPublisher returns linger after each publish it made.
type lingeringPublisher struct {
	message.Publisher
	linger time.Duration
}

func (p lingeringPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	time.Sleep(p.linger)
	return err
}

type countingPublisher struct {
	message.Publisher
	n *atomic.Int64
}

func (p countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return p.Publisher.Publish(topic, msgs...)
}
