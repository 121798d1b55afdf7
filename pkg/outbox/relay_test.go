package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// payload is what the relay tests put in a message: its key and its place
// in that key's sequence, so a consumer can check per-key order.
type payload struct {
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

func newKeyedMessage(key string, seq int) *message.Message {
	raw, _ := json.Marshal(payload{Key: key, Seq: seq}) // cannot fail: two plain fields
	return outbox.NewMessage(key, raw)
}

func TestRelay(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		pool  *pgxpool.Pool
		pub   message.Publisher // the real watermill-kafka publisher
		topic string
		sink  *sink // everything that reached topic
	}

	setup := func(t *testing.T) (context.Context, *testBundle) {
		t.Helper()
		topic := newTopic(t)
		return t.Context(), &testBundle{
			pool:  newPool(t),
			pub:   newPublisher(t),
			topic: topic,
			sink:  newSink(t, topic),
		}
	}

	t.Run("PublishesCommittedRows", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)
		other := newTopic(t)
		otherSink := newSink(t, other)

		// Ten transactions, each writing one message for each of six keys;
		// four keys go to one topic and two to another, interleaved, so a
		// batch holds alternating runs of both topics.
		const rounds = 10
		keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
		topicOf := map[string]string{"k0": bundle.topic, "k1": bundle.topic, "k4": other, "k2": bundle.topic, "k3": bundle.topic, "k5": other}
		sent := map[string]*message.Message{}
		for seq := range rounds {
			msg := map[string]*message.Message{}
			for _, k := range keys {
				msg[k] = newKeyedMessage(k, seq)
				msg[k].Metadata.Set("source", "relay-test")
				sent[msg[k].UUID] = msg[k]
			}
			require.NoError(t, pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
				return errors.Join(
					outbox.PublishTx(ctx, tx, bundle.topic, msg["k0"], msg["k1"]),
					outbox.PublishTx(ctx, tx, other, msg["k4"]),
					outbox.PublishTx(ctx, tx, bundle.topic, msg["k2"], msg["k3"]),
					outbox.PublishTx(ctx, tx, other, msg["k5"]),
				)
			}))
		}

		// A batch size that does not divide the row count: Run must keep
		// going while batches come back full, then finish the remainder.
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, BatchSize: 7})
		startRelay(t, relay)

		var want, wantOther []string
		for id, msg := range sent {
			if topicOf[msg.Metadata.Get(outbox.KeyMetadata)] == other {
				wantOther = append(wantOther, id)
			} else {
				want = append(want, id)
			}
		}
		bundle.sink.WaitFor(t, want)
		otherSink.WaitFor(t, wantOther)
		// Stats count a batch after its transaction commits.
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published >= int64(len(sent)) },
			"rows still unmarked after their messages reached Kafka")
		require.Equal(t, outbox.RelayStats{Published: int64(len(sent)), Batches: int64(len(sent)+6) / 7}, relay.Stats())
		require.Equal(t, len(sent), countRows(t, bundle.pool, "published_at >= created_at"))

		partitionOf := map[string]int32{}
		lastOffset := map[string]int64{}
		lastSeq := map[string]int{}
		records := append(bundle.sink.Records(), otherSink.Records()...)
		require.Len(t, records, len(sent), "nothing failed, so nothing may be published twice")
		for _, r := range records {
			msg, ok := sent[messageID(r)]
			require.True(t, ok, "unknown message id %q", messageID(r))
			key := msg.Metadata.Get(outbox.KeyMetadata)
			require.Equal(t, topicOf[key], r.Topic)
			require.Equal(t, key, string(r.Key), "partition key must become the Kafka record key")
			require.Equal(t, []byte(msg.Payload), r.Value)
			require.Equal(t, key, header(r, outbox.KeyMetadata))
			require.Equal(t, "relay-test", header(r, "source"))

			var p payload
			require.NoError(t, json.Unmarshal(r.Value, &p))
			if part, seen := partitionOf[key]; seen {
				require.Equal(t, part, r.Partition, "key %s spread over partitions", key)
				require.Greater(t, r.Offset, lastOffset[key])
				require.Equal(t, lastSeq[key]+1, p.Seq, "key %s out of order", key)
			} else {
				require.Zero(t, p.Seq, "key %s: first record is not the first message", key)
			}
			partitionOf[key], lastOffset[key], lastSeq[key] = r.Partition, r.Offset, p.Seq
		}
		for _, k := range keys {
			require.Equal(t, rounds-1, lastSeq[k], "key %s", k)
		}
	})

	// Three replicas share the database, each with its own Kafka producer,
	// while eight producers commit concurrently: nothing is lost, every row
	// ends marked, and no row is marked twice.
	t.Run("Replicas", func(t *testing.T) {
		t.Parallel()
		for _, parallel := range []bool{false, true} {
			name := map[bool]string{false: "Ordered", true: "Parallel"}[parallel]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, bundle := setup(t)

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

				const producers, txPerProducer, msgsPerTx, keysPerProducer = 8, 33, 4, 5
				written := make([][]string, producers)
				var g errgroup.Group
				for p := range producers {
					g.Go(func() error {
						seq := map[string]int{}
						for i := range txPerProducer {
							var msgs []*message.Message
							for j := range msgsPerTx {
								key := fmt.Sprintf("p%d-k%d", p, (msgsPerTx*i+j)%keysPerProducer)
								msgs = append(msgs, newKeyedMessage(key, seq[key]))
								seq[key]++
							}
							err := pgx.BeginFunc(ctx, bundle.pool, func(tx pgx.Tx) error {
								return outbox.PublishTx(ctx, tx, bundle.topic, msgs...)
							})
							if err != nil {
								return err
							}
							written[p] = append(written[p], ids(msgs)...)
						}
						return nil
					})
				}
				require.NoError(t, g.Wait())
				var want []string
				for _, w := range written {
					want = append(want, w...)
				}
				require.Len(t, want, producers*txPerProducer*msgsPerTx)

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
				seen := map[string]bool{}
				lastSeq := map[string]int{}
				for _, r := range records {
					if seen[messageID(r)] {
						continue // a duplicate; only first arrivals count
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
		ctx, bundle := setup(t)
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
				  AND state = 'idle' AND query = $1)`, "LISTEN "+outbox.NotifyChannel).Scan(&listening))
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
		ctx, bundle := setup(t)
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
	t.Run("WakesOnCommit", func(t *testing.T) {
		t.Parallel()
		_, bundle := setup(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: time.Hour})

		first := outbox.NewMessage("k", []byte("0"))
		publishCommitted(t, bundle.pool, bundle.topic, first)
		startRelay(t, relay)
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 }, "the first row was not published")

		// The relay is now idle with an hour to its next poll. Each commit
		// must wake it. (Besides notifications, only the one wake-up the
		// listener gives itself after LISTEN could publish a row here, so
		// with notifications broken at most one of these would go out.)
		for i := 2; i <= 4; i++ {
			msg := outbox.NewMessage("k", []byte{byte('0' + i)})
			start := time.Now()
			publishCommitted(t, bundle.pool, bundle.topic, msg)
			eventually(t, 5*time.Second, func() bool { return relay.Stats().Published == int64(i) },
				"commit %d did not wake the relay", i)
			bundle.sink.WaitFor(t, []string{msg.UUID})
			t.Logf("commit %d published after %v", i, time.Since(start))
		}
	})

	// A row whose producer did not notify (PublishTx skips the notification
	// while another producer holds it) is found by the poll, which first
	// asks whether any row waits at all.
	t.Run("PollFindsRowWithoutNotification", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: 50 * time.Millisecond})
		startRelay(t, relay)
		publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", []byte("notified")))
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })
		time.Sleep(100 * time.Millisecond) // past the follow-up polls: the relay waits for its regular poll

		var id string
		require.NoError(t, bundle.pool.QueryRow(ctx, `
			INSERT INTO outbox_messages (message_id, topic, payload) VALUES (gen_random_uuid(), $1, 'silent')
			RETURNING message_id::text`, bundle.topic).Scan(&id)) // no NOTIFY
		bundle.sink.WaitFor(t, []string{id})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 2 })
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	// An open transaction that wrote a row does not hold back rows committed
	// after it, and its own row goes out once it commits.
	t.Run("LongTransactionDoesNotStall", func(t *testing.T) {
		t.Parallel()
		ctx, bundle := setup(t)
		relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub})
		startRelay(t, relay)

		txA, err := bundle.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = txA.Rollback(context.Background()) })
		msgA := outbox.NewMessage("a", []byte("A"))
		require.NoError(t, outbox.PublishTx(ctx, txA, bundle.topic, msgA))
		var idA int64
		require.NoError(t, txA.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE message_id = $1`, msgA.UUID).Scan(&idA))

		msgB := outbox.NewMessage("b", []byte("B"))
		publishCommitted(t, bundle.pool, bundle.topic, msgB)
		var idB int64
		require.NoError(t, bundle.pool.QueryRow(ctx, `SELECT id FROM outbox_messages WHERE message_id = $1`, msgB.UUID).Scan(&idB))
		require.Less(t, idA, idB, "A's row must come first in id order for this test to mean anything")

		bundle.sink.WaitFor(t, []string{msgB.UUID})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })
		require.Equal(t, 1, countRows(t, bundle.pool, "published_at IS NOT NULL"))
		require.Zero(t, bundle.sink.Counts()[msgA.UUID], "an uncommitted row reached Kafka")

		require.NoError(t, txA.Commit(ctx))
		bundle.sink.WaitFor(t, []string{msgA.UUID})
		eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 2 })
		require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
	})

	t.Run("FailingPublisher", func(t *testing.T) {
		t.Parallel()

		// The broker refuses: rows stay pending while it does, and all go
		// out once it recovers.
		t.Run("BeforeSend", func(t *testing.T) {
			t.Parallel()
			_, bundle := setup(t)
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.down.Store(true)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: 10 * time.Millisecond})

			var msgs []*message.Message
			for i := range 10 {
				msgs = append(msgs, newKeyedMessage(fmt.Sprint("k", i%3), i))
			}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			startRelay(t, relay)

			// Wait for a few failed attempts, or for the first wrongly marked row.
			eventually(t, waitTimeout, func() bool {
				return relay.Stats().Errors >= 3 || countRows(t, bundle.pool, "published_at IS NOT NULL") > 0
			})
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NOT NULL"), "a row was marked though Publish failed")
			require.GreaterOrEqual(t, relay.Stats().Errors, int64(3))
			require.Zero(t, relay.Stats().Published)
			require.Empty(t, bundle.sink.Records())

			pub.down.Store(false)
			bundle.sink.WaitFor(t, ids(msgs))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == int64(len(msgs)) })
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
		})

		// The broker stores the batch but the acknowledgement is lost, twice:
		// the rows are republished, so the consumer sees duplicates of the
		// same message ids, never a gap.
		t.Run("AckLost", func(t *testing.T) {
			t.Parallel()
			_, bundle := setup(t)
			const lostAcks = 2
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.loseAcks.Store(lostAcks)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: 10 * time.Millisecond})

			var msgs []*message.Message
			for i := range 10 {
				msgs = append(msgs, newKeyedMessage(fmt.Sprint("k", i%3), i))
			}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			startRelay(t, relay)

			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == int64(len(msgs)) })
			require.Equal(t, outbox.RelayStats{Published: int64(len(msgs)), Batches: 1, Errors: lostAcks}, relay.Stats())
			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"))
			eventually(t, waitTimeout, func() bool { return len(bundle.sink.Records()) == (lostAcks+1)*len(msgs) })
			counts := bundle.sink.Counts()
			for _, msg := range msgs {
				require.Equal(t, lostAcks+1, counts[msg.UUID], "message %s", msg.UUID)
			}
		})
	})

	t.Run("Retention", func(t *testing.T) {
		t.Parallel()

		t.Run("DeletePublished", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setup(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, Retention: time.Hour, RetentionBatch: 2,
			})

			// Log each DELETE statement's rows, oldest first, to see the batches.
			_, err := bundle.pool.Exec(ctx, `
				CREATE TABLE delete_log (stmt serial PRIMARY KEY, keys text[]);
				CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					INSERT INTO delete_log (keys)
					SELECT array_agg(partition_key ORDER BY published_at) FROM old_rows;
					RETURN NULL;
				END $$;
				CREATE TRIGGER log_delete AFTER DELETE ON outbox_messages
				REFERENCING OLD TABLE AS old_rows
				FOR EACH STATEMENT EXECUTE FUNCTION log_delete();`)
			require.NoError(t, err)

			// age: how long ago the row was published; "" for a pending row.
			rows := []struct{ key, age string }{
				{"old-5h", "5 hours"}, {"old-4h", "4 hours"}, {"old-3h", "3 hours"},
				{"old-2h", "2 hours"}, {"old-61m", "61 minutes"},
				{"recent-59m", "59 minutes"}, {"recent-1m", "1 minute"},
				{"pending", ""},
			}
			for _, r := range rows {
				publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage(r.key, nil))
				_, err := bundle.pool.Exec(ctx, `
					UPDATE outbox_messages
					SET created_at = now() - interval '6 hours',
					    published_at = now() - nullif($2, '')::interval
					WHERE partition_key = $1`, r.key, r.age)
				require.NoError(t, err)
			}

			deleted, err := relay.DeletePublished(ctx)
			require.NoError(t, err)
			require.Equal(t, int64(5), deleted)
			require.Equal(t, int64(5), relay.Stats().Deleted)

			left, err := bundle.pool.Query(ctx, `SELECT partition_key FROM outbox_messages ORDER BY id`)
			require.NoError(t, err)
			leftKeys, err := pgx.CollectRows(left, pgx.RowTo[string])
			require.NoError(t, err)
			require.Equal(t, []string{"recent-59m", "recent-1m", "pending"}, leftKeys)

			logged, err := bundle.pool.Query(ctx, `SELECT keys FROM delete_log WHERE keys IS NOT NULL ORDER BY stmt`)
			require.NoError(t, err)
			batches, err := pgx.CollectRows(logged, pgx.RowTo[[]string])
			require.NoError(t, err)
			require.Equal(t, [][]string{{"old-5h", "old-4h"}, {"old-3h", "old-2h"}, {"old-61m"}}, batches,
				"want batches of RetentionBatch rows, oldest first")

			deleted, err = relay.DeletePublished(ctx)
			require.NoError(t, err)
			require.Zero(t, deleted)
		})

		t.Run("RunDeletes", func(t *testing.T) {
			t.Parallel()
			ctx, bundle := setup(t)
			relay := newRelay(t, outbox.RelayConfig{
				Pool: bundle.pool, Publisher: bundle.pub, RetentionInterval: 20 * time.Millisecond,
			})
			startRelay(t, relay)

			msgs := []*message.Message{outbox.NewMessage("a", nil), outbox.NewMessage("b", nil), outbox.NewMessage("c", nil)}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 3 })
			require.Equal(t, 3, countRows(t, bundle.pool, "true"), "rows younger than Retention were deleted")

			_, err := bundle.pool.Exec(ctx, `UPDATE outbox_messages SET published_at = published_at - interval '2 hours'`)
			require.NoError(t, err)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Deleted == 3 }, "the retention job did not run")
			require.Zero(t, countRows(t, bundle.pool, "true"))
		})
	})

	t.Run("Shutdown", func(t *testing.T) {
		t.Parallel()

		t.Run("Idle", func(t *testing.T) {
			t.Parallel()
			_, bundle := setup(t)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: bundle.pub, PollInterval: time.Hour})
			run := startRelay(t, relay)
			publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", nil))
			eventually(t, waitTimeout, func() bool { return relay.Stats().Published == 1 })

			took := run.Stop(t)
			require.Less(t, took, 3*time.Second)
			t.Logf("Run returned %v after cancel", took)
		})

		t.Run("DuringErrorBackoff", func(t *testing.T) {
			t.Parallel()
			_, bundle := setup(t)
			pub := &faultyPublisher{Publisher: bundle.pub}
			pub.down.Store(true)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, ErrorBackoff: time.Hour})
			publishCommitted(t, bundle.pool, bundle.topic, outbox.NewMessage("k", nil))
			run := startRelay(t, relay)
			eventually(t, waitTimeout, func() bool { return relay.Stats().Errors == 1 })

			require.Less(t, run.Stop(t), 3*time.Second)
		})

		// A batch in flight when the context ends is finished and marked,
		// not abandoned to be published again.
		t.Run("FinishesBatchInFlight", func(t *testing.T) {
			t.Parallel()
			_, bundle := setup(t)
			pub := newGatedPublisher(bundle.pub)
			relay := newRelay(t, outbox.RelayConfig{Pool: bundle.pool, Publisher: pub, PollInterval: time.Hour})
			msgs := []*message.Message{outbox.NewMessage("a", nil), outbox.NewMessage("b", nil), outbox.NewMessage("c", nil)}
			publishCommitted(t, bundle.pool, bundle.topic, msgs...)

			run := startRelay(t, relay)
			t.Cleanup(pub.Release)
			pub.WaitEntered(t)
			// End Run's context while Publish is blocked, then let it finish.
			run.Cancel()
			pub.Release()
			run.Wait(t)

			require.Zero(t, countRows(t, bundle.pool, "published_at IS NULL"), "the batch in flight was abandoned")
			require.Equal(t, int64(len(msgs)), relay.Stats().Published)
			bundle.sink.WaitFor(t, ids(msgs))
		})
	})
}

func TestNewRelay(t *testing.T) {
	t.Parallel()

	pool, err := pgxpool.New(t.Context(), testPG.URL("postgres")) // never connects: no query is run
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pub := newPublisher(t)

	tests := []struct {
		name    string
		cfg     outbox.RelayConfig
		wantErr string
	}{
		{"NoPool", outbox.RelayConfig{Publisher: pub}, "RelayConfig.Pool"},
		{"NoPublisher", outbox.RelayConfig{Pool: pool}, "RelayConfig.Publisher"},
		{"NegativeBatchSize", outbox.RelayConfig{Pool: pool, Publisher: pub, BatchSize: -1}, "RelayConfig.BatchSize"},
		{"PollIntervalTooShort", outbox.RelayConfig{Pool: pool, Publisher: pub, PollInterval: time.Microsecond}, "RelayConfig.PollInterval"},
		{"NegativeRetention", outbox.RelayConfig{Pool: pool, Publisher: pub, Retention: -time.Second}, "RelayConfig.Retention"},
		{"NegativeErrorBackoff", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: -time.Second}, "RelayConfig.ErrorBackoff"},
		{"NegativeBatchTimeout", outbox.RelayConfig{Pool: pool, Publisher: pub, BatchTimeout: -time.Second}, "RelayConfig.BatchTimeout"},
		{"NegativeRetentionInterval", outbox.RelayConfig{Pool: pool, Publisher: pub, RetentionInterval: -time.Second}, "RelayConfig.RetentionInterval"},
		{"NegativeRetentionBatch", outbox.RelayConfig{Pool: pool, Publisher: pub, RetentionBatch: -1}, "RelayConfig.RetentionBatch"},
		{"MaxErrorBackoffBelowErrorBackoff", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: time.Second, MaxErrorBackoff: time.Millisecond}, "RelayConfig.MaxErrorBackoff"},
		{"NegativeMaxMessageBytes", outbox.RelayConfig{Pool: pool, Publisher: pub, MaxMessageBytes: -1}, "RelayConfig.MaxMessageBytes"},
		{"Defaults", outbox.RelayConfig{Pool: pool, Publisher: pub}, ""},
		{"LongErrorBackoffRaisesTheDefaultCap", outbox.RelayConfig{Pool: pool, Publisher: pub, ErrorBackoff: time.Hour}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			relay, err := outbox.NewRelay(tt.cfg)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, relay)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.Nil(t, relay)
		})
	}
}

var errBrokerDown = errors.New("injected: broker unavailable")

// faultyPublisher puts fault injection in front of the real Kafka publisher
// (in the spirit of pgx's faultyconn): the broker stays real.
type faultyPublisher struct {
	message.Publisher
	down     atomic.Bool  // every call fails without sending while set
	loseAcks atomic.Int64 // this many calls send, then report failure
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.down.Load() {
		return errBrokerDown
	}
	if p.loseAcks.Load() > 0 {
		p.loseAcks.Add(-1)
		if err := p.Publisher.Publish(topic, msgs...); err != nil {
			return err
		}
		return errors.New("injected: acknowledgement lost")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// gatedPublisher blocks the first Publish call until Release.
type gatedPublisher struct {
	message.Publisher
	entered chan struct{} // closed when the first call arrives
	release chan struct{} // closed to let it proceed
	once    sync.Once
	calls   atomic.Int64
}

// newGatedPublisher wraps pub. Register t.Cleanup(gate.Release) after
// startRelay, so that a failing test opens the gate before it stops the relay
// (cleanups run last-in first-out).
func newGatedPublisher(pub message.Publisher) *gatedPublisher {
	return &gatedPublisher{Publisher: pub, entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *gatedPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.calls.Add(1) == 1 {
		close(p.entered)
		<-p.release
	}
	return p.Publisher.Publish(topic, msgs...)
}

// WaitEntered waits until the first Publish call is blocked in the gate.
func (p *gatedPublisher) WaitEntered(t testing.TB) {
	t.Helper()
	select {
	case <-p.entered:
	case <-time.After(waitTimeout):
		t.Fatal("the relay never started publishing")
	}
}

// Release lets the blocked call (and all later ones) through.
func (p *gatedPublisher) Release() { p.once.Do(func() { close(p.release) }) }
