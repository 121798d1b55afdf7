package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestRelayReplicas: replicas take turns, a standby takes over from a dead
// relay, and a relay that lost its session cannot mark what it published.
func TestRelayReplicas(t *testing.T) {
	t.Parallel()

	t.Run("Replicas", func(t *testing.T) {
		t.Parallel()
		for _, parallel := range []bool{false, true} {
			name := map[bool]string{false: "Ordered", true: "Parallel"}[parallel]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, bundle := setupRelay(t)

				relays := make([]*outbox.Relay, 3)
				for i := range relays {
					relays[i] = newRelay(t, outbox.RelayConfig{
						Pool:      bundle.pool,
						Publisher: newPublisher(t),
						BatchSize: 50,
						Parallel:  parallel,
					})
					startRelay(t, relays[i])
				}

				const producers, keysPerProducer = 8, 5
				want := writeKeyed(t, ctx, bundle, "", producers, 33, 4, keysPerProducer, nil)

				bundle.sink.WaitFor(t, want)
				stats := func() (published int64, perRelay []int64) {
					for _, r := range relays {
						s := r.Stats()
						require.Zero(t, s.Errors)
						published += s.Published
						perRelay = append(perRelay, s.Published)
					}
					return published, perRelay
				}
				eventually(t, waitTimeout, func() bool { n, _ := stats(); return n >= int64(len(want)) },
					"rows still unmarked after their messages reached Kafka")
				published, perRelay := stats()
				require.Equal(t, int64(len(want)), published, "a row was marked by two relays")
				require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
				require.Equal(t, len(want), countRows(t, bundle.pool, "true"))
				records := bundle.sink.Records()
				t.Logf("%d rows, %d records, published per relay %v", len(want), len(records), perRelay)

				if parallel {
					return // SKIP LOCKED replicas promise no order
				}
				// Advisory-lock mode: the first arrival of each key's
				// messages follows the order in which they were committed.
				lastSeq := requireKeyOrder(t, records)
				require.Len(t, lastSeq, producers*keysPerProducer)
			})
		}
	})

	// Advisory-lock mode: the active relay's connection dies mid-batch (its
	// backend is terminated while it waits on the broker). Its transaction
	// aborts, which frees the lock and the rows, and the standby publishes
	// them within its PollInterval.

	t.Run("StandbyTakesOver", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		gate := newGatedPublisher(bundle.pub)
		active := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: gate, PollInterval: time.Hour})

		// The standby is another process in production: give it its own
		// pool, named, and count its finished attempts (each RelayOnce
		// releases one connection; the listener's is never released).
		cfg := bundle.pool.Config()
		cfg.ConnConfig.RuntimeParams["application_name"] = "standby"
		var attempts atomic.Int64
		cfg.AfterRelease = func(*pgx.Conn) bool { attempts.Add(1); return true }
		standbyPool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(standbyPool.Close)
		const pollInterval = 200 * time.Millisecond
		standby := newRelay(t, outbox.RelayConfig{Pool: standbyPool, Publisher: newPublisher(t), PollInterval: pollInterval})

		var msgs []*message.Message
		for i := range 5 {
			msgs = append(msgs, newKeyedMessage("k", i))
		}
		publishCommitted(t, bundle.pool, bundle.topic, msgs...)
		startRelay(t, active)
		t.Cleanup(gate.Release)
		gate.WaitEntered(t) // active holds the relay lock and the rows
		startRelay(t, standby)

		// Let the standby go idle first: its listener is up and it has made
		// two more attempts since (the listener's one wake-up and polls), so
		// after the kill only its poll can bring it back.
		eventually(t, waitTimeout, func() bool {
			var listening bool
			require.NoError(t, bundle.pool.QueryRow(ctx, `
				SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'standby'
				  AND state = 'idle' AND query = $1)`, "LISTEN "+pgx.Identifier{outbox.NotifyChannel("public")}.Sanitize()).Scan(&listening))
			return listening
		}, "the standby never listened")
		since := attempts.Load()
		eventually(t, waitTimeout, func() bool { return attempts.Load() >= since+2 })
		require.Zero(t, standby.Stats().Published, "the standby published while the active relay held the lock")

		// Any advisory lock in this fresh database is the relay's.
		var killed int
		require.NoError(t, bundle.pool.QueryRow(ctx, `
			SELECT count(pg_terminate_backend(pid)) FROM pg_locks
			WHERE locktype = 'advisory' AND granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&killed))
		require.Equal(t, 1, killed, "want exactly one relay holding the lock")

		start := time.Now()
		eventually(t, pollInterval+5*time.Second, func() bool { return standby.Stats().Published == int64(len(msgs)) },
			"the standby did not take over the dead relay's rows")
		t.Logf("standby took over after %v", time.Since(start))
		bundle.sink.WaitFor(t, ids(msgs))

		// The dead relay's publish now goes through (duplicates, which the
		// inbox absorbs), but it cannot mark rows on a dead connection.
		gate.Release()
		eventually(t, waitTimeout, func() bool { return active.Stats().Errors >= 1 })
		require.Zero(t, active.Stats().Published)
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	// A relay that stops in the middle of a batch (a paused process, a
	// publish that never returns) loses the lead without anyone killing
	// it: Postgres ends its transaction past BatchTimeout, which frees the
	// relay lock and the rows for the standby, and the stopped relay can
	// never commit its marks. Before, the standby waited for as long as the
	// stopped relay did.

	t.Run("StoppedRelayIsFenced", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setupRelay(t)
		gate := newGatedPublisher(bundle.pub)
		const batchTimeout = time.Second
		stopped := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: gate, PollInterval: time.Hour, BatchTimeout: batchTimeout})
		standbyPool, err := pgxpool.NewWithConfig(ctx, bundle.pool.Config())
		require.NoError(t, err)
		t.Cleanup(standbyPool.Close)
		standby := newRelay(t, outbox.RelayConfig{Pool: standbyPool, Publisher: newPublisher(t), PollInterval: 100 * time.Millisecond})

		var msgs []*message.Message
		for i := range 5 {
			msgs = append(msgs, newKeyedMessage("k", i))
		}
		publishCommitted(t, bundle.pool, bundle.topic, msgs...)
		startRelay(t, stopped)
		t.Cleanup(gate.Release)
		gate.WaitEntered(t) // the stopped relay holds the lock and the rows
		startRelay(t, standby)

		start := time.Now()
		eventually(t, batchTimeout+10*time.Second, func() bool { return standby.Stats().Published == int64(len(msgs)) },
			"the standby never took over from the stopped relay")
		t.Logf("standby took over after %v", time.Since(start))
		bundle.sink.WaitFor(t, ids(msgs))

		gate.Release() // its publish goes through (duplicates), its mark cannot
		eventually(t, waitTimeout, func() bool { return stopped.Stats().Errors >= 1 })
		require.Zero(t, stopped.Stats().Published)
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	// With an hour between polls, only the NOTIFY that PublishTx queues can
	// wake an idle relay within seconds.
}

// writeKeyed commits, from producers goroutines at once, txs transactions
// of msgs messages each, spread over keys keys per producer (named with
// prefix), each key's messages numbered from 0 in commit order; it returns
// every message id. Given halfway, each producer waits for it to close
// half-way through.
func writeKeyed(t *testing.T, ctx context.Context, bundle *relayBundle, prefix string, producers, txs, msgs, keys int, halfway <-chan struct{}) []string {
	t.Helper()
	written := make([][]string, producers)
	var g errgroup.Group
	for p := range producers {
		g.Go(func() error {
			seq := map[string]int{}
			for i := range txs {
				if i == txs/2 && halfway != nil {
					<-halfway
				}
				var batch []*message.Message
				for j := range msgs {
					key := fmt.Sprintf("%sp%d-k%d", prefix, p, (msgs*i+j)%keys)
					batch = append(batch, newKeyedMessage(key, seq[key]))
					seq[key]++
				}
				err := pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
					return outbox.PublishTx(ctx, tx, bundle.topic, batch...)
				})
				if err != nil {
					return err
				}
				written[p] = append(written[p], ids(batch)...)
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	var all []string
	for _, w := range written {
		all = append(all, w...)
	}
	require.Len(t, all, producers*txs*msgs)
	return all
}

// writeKeyedAsync runs writeKeyed on a goroutine of its own and returns
// what it wrote on the channel, nil if it failed: a test that waits for it
// fails instead of hanging when a producer's transaction fails (the
// failure stops that goroutine, not the test's).
func writeKeyedAsync(t *testing.T, ctx context.Context, bundle *relayBundle, prefix string, producers, txs, msgs, keys int, halfway <-chan struct{}) <-chan []string {
	written := make(chan []string, 1)
	go func() {
		var ids []string
		defer func() { written <- ids }()
		ids = writeKeyed(t, ctx, bundle, prefix, producers, txs, msgs, keys, halfway)
	}()
	return written
}

// requireKeyOrder checks that the first arrival of each key's messages in
// records (newKeyedMessage's) follows their commit order: 0, 1, 2, ...,
// repeats of a message already seen aside. It returns each key's last
// number.
func requireKeyOrder(t *testing.T, records []*kgo.Record) map[string]int {
	t.Helper()
	seen := map[string]bool{}
	lastSeq := map[string]int{}
	for _, r := range records {
		if seen[messageID(r)] {
			continue // a repeat; only first arrivals count
		}
		seen[messageID(r)] = true
		var p payload
		require.NoError(t, json.Unmarshal(r.Value, &p))
		require.Equal(t, p.Key, string(r.Key))
		if last, ok := lastSeq[p.Key]; ok {
			require.Equal(t, last+1, p.Seq, "key %s: message %d arrived after %d", p.Key, p.Seq, last)
		} else {
			require.Zero(t, p.Seq, "key %s: message %d arrived first", p.Key, p.Seq)
		}
		lastSeq[p.Key] = p.Seq
	}
	return lastSeq
}
