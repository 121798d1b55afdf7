package inbox_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestContinuitySeesGapsAndRewinds: a producer's outbox numbers each key's
// messages; its relay publishes them to a consumer behind a real router.
// Key k's third message is marked sent without being sent (a relay's bug):
// the fourth shows a gap. Then the producer's database loses its last
// number (a failover that lost a committed transaction): its next message
// carries 4 again, a rewind. Then the third is sent at last: late, filling
// the gap. Key j flows in order, and the relay sends its
// first message again after its second (a duplicate): no breach. Each
// breach is written, counted, and reported on the delivery that showed it,
// whether it was applied, dead-lettered or parked (k's second message is
// poison: with HoldKey the rest of k parks).
func TestContinuitySeesGapsAndRewinds(t *testing.T) {
	t.Parallel()
	for _, run := range []struct {
		name   string
		policy inbox.DeadLetterPolicy
		batch  bool
	}{{"PerMessage", inbox.SkipKey, false}, {"Batches", inbox.SkipKey, true}, {"HoldKeyParks", inbox.HoldKey, false}} {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			h := setupHold(t, run.policy, run.batch)
			ctx := h.ctx
			write := func(key, payload string, then ...string) string {
				t.Helper()
				msg := outbox.NewMessage(key, []byte(payload))
				require.NoError(t, pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
					if err := outbox.PublishTx(ctx, tx, h.topic, msg); err != nil {
						return err
					}
					for _, sql := range then {
						if _, err := tx.Exec(ctx, sql, msg.UUID); err != nil {
							return err
						}
					}
					return nil
				}))
				return msg.UUID
			}
			settled := func(ids ...string) {
				t.Helper()
				for _, id := range ids {
					eventually(t, func() bool {
						for _, o := range h.events.outcomes(id) {
							if o != inbox.Retried {
								return true
							}
						}
						return false
					}, 20*time.Second, id+" to settle", h.events.count)
				}
			}

			k1, k2 := write("k", "k1"), write("k", "poison k2")
			k3 := write("k", "k3", `UPDATE outbox_messages SET published_at = now() WHERE message_id = $1`) // not sent
			k4 := write("k", "k4")
			settled(k1, k2, k4)
			_, err := h.pool.Exec(ctx, `UPDATE outbox_key_sequences SET seq = seq - 1 WHERE topic = $1 AND partition_key = 'k'`, h.topic)
			require.NoError(t, err)
			k5 := write("k", "k5") // numbered 4 again
			settled(k5)
			_, err = h.pool.Exec(ctx, `UPDATE outbox_messages SET published_at = NULL WHERE message_id = $1`, k3) // sent at last
			require.NoError(t, err)
			settled(k3)

			j1, j2 := write("j", "j1"), write("j", "j2")
			settled(j1, j2)
			_, err = h.pool.Exec(ctx, `UPDATE outbox_messages SET published_at = NULL WHERE message_id = $1`, j1) // sent again
			require.NoError(t, err)
			eventually(t, func() bool { return len(h.events.outcomes(j1)) > 1 }, 20*time.Second, "j1 again", h.events.count)
			j3 := write("j", "j3")
			settled(k5, j3)
			require.Equal(t, []inbox.Outcome{inbox.Applied, inbox.Duplicate}, h.events.outcomes(j1))

			breaches, err := inboxadmin.New(h.pool).ListBreaches(ctx, consumer, 10)
			require.NoError(t, err)
			for i := range breaches {
				require.NotEmpty(t, breaches[i].Stream)
				require.WithinDuration(t, time.Now(), breaches[i].DetectedAt, time.Minute)
				breaches[i].Stream, breaches[i].DetectedAt = "", time.Time{}
			}
			require.Equal(t, []inbox.Breach{
				{Consumer: consumer, Kind: inbox.Late, Topic: h.topic, Key: "k", Expected: 5, Got: 3, MessageID: k3, PreviousID: k4},
				{Consumer: consumer, Kind: inbox.Rewind, Topic: h.topic, Key: "k", Expected: 5, Got: 4, MessageID: k5, PreviousID: k4},
				{Consumer: consumer, Kind: inbox.Gap, Topic: h.topic, Key: "k", Expected: 3, Got: 4, MessageID: k4, PreviousID: k2},
			}, breaches)
			counts, err := inboxadmin.New(h.pool).Continuity(ctx, consumer)
			require.NoError(t, err)
			require.Equal(t, inboxadmin.ContinuityCounts{Gaps: 1, Rewinds: 1, Late: 1}, counts)

			want := map[string]inbox.BreachKind{k4: inbox.Gap, k5: inbox.Rewind, k3: inbox.Late}
			for _, e := range h.events.all() {
				if kind, ok := want[e.MessageID]; ok && e.Outcome != inbox.Retried {
					require.Len(t, e.Breaches, 1, "%s: %s", e.MessageID, e.Outcome)
					require.Equal(t, kind, e.Breaches[0].Kind)
					delete(want, e.MessageID)
				} else {
					require.Empty(t, e.Breaches, "%s: %s", e.MessageID, e.Outcome)
				}
			}
			require.Empty(t, want, "breaches not reported on their deliveries")
			if run.policy == inbox.HoldKey {
				require.Equal(t, "parked", h.status(t, k4), "k4's gap was seen as it parked")
			}
		})
	}
}

// TestContinuityRefusesAMalformedNumber: a number that is not
// "<stream>:<n>" is a producer's bug: quarantined as invalid, the reason
// naming it, the partition going on.
func TestContinuityRefusesAMalformedNumber(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	mw := in.Middleware(b.handler.handle)
	for _, v := range []string{"7", "not-a-uuid:7", "0190a7c4-0000-4000-8000-00000000000a:0", "0190a7c4-0000-4000-8000-00000000000a:x"} {
		msg := message.NewMessage(newID(), []byte("x"))
		msg.Metadata.Set(outbox.SequenceMetadata, v)
		msg.SetContext(b.ctx)
		_, err := mw(msg)
		require.NoError(t, err)
		e := b.events.last(t)
		require.Equal(t, inbox.Invalid, e.Outcome, v)
		require.Contains(t, e.Reason, outbox.SequenceMetadata, v)
	}
}

// TestSweepForgetsRestingKeys: the sweep deletes the continuity state of
// keys not heard from within Retention (their next message starts afresh),
// and keeps the others'.
func TestSweepForgetsRestingKeys(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{Retention: time.Hour, RedeliveryHorizon: time.Hour, RetentionBatch: 1})
	_, err := b.pool.Exec(b.ctx, `INSERT INTO inbox_key_sequences (consumer, topic, partition_key, stream, seq, message_id, touched_at)
		SELECT $1, 't', k, gen_random_uuid(), 7, 'm-' || k, now() - age
		FROM (VALUES ('rested', interval '61 minutes'), ('rested-too', interval '2 hours'), ('recent', interval '59 minutes')) AS v(k, age)`, consumer)
	require.NoError(t, err)
	_, err = in.Sweep(b.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"recent"}, scalar[[]string](t, b, `SELECT array_agg(partition_key) FROM inbox_key_sequences`))
}

// TestContinuityOfABatch: several numbered messages of a batch, some of one
// key, each meet the state the message of their key before them left: a
// gap remembers its missing numbers, one of them coming late fills it (late,
// once), any other number at or below the highest is a rewind, and the
// highest never goes back.
func TestContinuityOfABatch(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	stream := newID()
	msg := func(key string, n int) *message.Message {
		m := message.NewMessage(newID(), []byte("x"))
		m.Metadata.Set(outbox.KeyMetadata, key)
		m.Metadata.Set(outbox.SequenceMetadata, fmt.Sprintf("%s:%d", stream, n))
		return m
	}
	kinds := func(msgs ...*message.Message) []string {
		t.Helper()
		var got []string
		require.NoError(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			breaches, err := in.CheckContinuityOf(b.ctx, tx, "t", msgs)
			for i, bs := range breaches {
				for _, br := range bs {
					got = append(got, fmt.Sprintf("%d:%s %d→%d", i, br.Kind, br.Expected, br.Got))
				}
			}
			return err
		}))
		return got
	}
	require.Empty(t, kinds(msg("k", 1), msg("k", 2), msg("j", 5), msg("k", 3)), "in order, and j's first seen")
	require.Equal(t, []string{"1:gap 6→7", "2:rewind 8→4", "3:late 8→6"}, kinds(msg("k", 4), msg("j", 7), msg("j", 4), msg("j", 6)))
	require.Equal(t, []string{"0:gap 5→9", "1:rewind 8→6"}, kinds(msg("k", 9), msg("j", 6), msg("j", 8)),
		"the state moved to each key's highest number, its gap filled")
	// A batch whose keys all differ.
	require.Empty(t, kinds(msg("a", 1), msg("b", 1)))
	require.Equal(t, []string{"0:gap 2→3", "1:rewind 2→1"}, kinds(msg("a", 3), msg("b", 1), msg("c", 1)))
	require.Equal(t, []string{"0:late 4→2"}, kinds(msg("a", 2), msg("b", 2), msg("c", 2)), "a's gap filled; b and c in order")
}
