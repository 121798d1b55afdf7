package main

// Probe streams, for the ordered-per-key invariant (chaos/judge/ordered.go). While the
// load runs, the harness commits numbered messages into each service's
// outbox itself, through the library's public API (outbox.PublishTx) in
// transactions of its own on a pool of its own: probeKeys keys, a sequence
// number per key that grows in commit order (one writer per service,
// committing one transaction after the other), a few keys per transaction,
// keys interleaved. Nothing consumes the probe topics; the services'
// relays publish the rows with everything else, across the same kills,
// Postgres restarts and shard handovers.
//
// The transactions come in pairs on the same keys, back to back: a key's
// rows of two transactions then sit a few rows apart in the outbox, as
// close as its rows of one, so relays that split a run of rows between
// them and publish the halves out of order (the ordering control run,
// RELAY_PARALLEL) put a key out of order across transactions too, not only
// within one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/standby"
)

const (
	probeKeys      = 50 // keys per service
	probeKeysPerTx = 3  // keys a transaction writes, one or two messages each
	probeTxPerTick = 2  // transactions back to back on the same keys
	// probeMeanTick is how many messages a pair writes, on average.
	probeMeanTick = probeTxPerTick * probeKeysPerTx * 1.5
)

// probeTopic is the probe stream of service's outbox.
func probeTopic(service string) string { return service + ".probe" }

// probeTopics are every service's probe topics.
func probeTopics() []string {
	var topics []string
	for _, s := range system.Services {
		topics = append(topics, probeTopic(s))
	}
	return topics
}

// probeWriter commits one service's probe stream.
type probeWriter struct {
	service string
	// prefix starts every key of this run's stream: a Kafka kept from an
	// earlier run (KAFKA_BROKERS) holds that run's probes under other keys.
	prefix string
	rng    *rand.Rand
	next   [probeKeys]int // each key's next seq
	ledger judge.ProbeLedger
	// standbys (-standbys): a commit counts only once that many standbys
	// hold it, as the services' answers do (pkg/standby); one they do not
	// confirm is of unknown outcome, which resolve settles.
	standbys int
	// Transactions by outcome; their sum numbers the next one.
	committed, unknown, rolledBack int
	settled                        int // of the unknown ones, those resolve found committed
}

func newProbeWriter(service string, seed uint64) *probeWriter {
	stream := uint64(0x0bde7)
	for _, c := range service { // each service's stream its own choices
		stream = stream*31 + uint64(c)
	}
	run := time.Now().UnixNano() % 1_000_000_007
	return &probeWriter{service: service, prefix: fmt.Sprintf("probe-%d-", run),
		rng: rand.New(rand.NewPCG(seed, stream)), ledger: judge.ProbeLedger{}}
}

// ours returns the records of this run's stream: on its topic, under its
// keys.
func (w *probeWriter) ours(records []judge.Record) []judge.Record {
	var mine []judge.Record
	topic := probeTopic(w.service)
	for _, r := range records {
		if r.Topic == topic && strings.HasPrefix(r.Key, w.prefix) {
			mine = append(mine, r)
		}
	}
	return mine
}

// resolve settles the transactions of unknown outcome with the producer's
// outbox, once the run is over: a transaction commits all of its rows or
// none, so a row there means every message of it committed (then each must
// be in Kafka), and none there means none did (then a copy in Kafka is a
// phantom). Published rows stay RELAY_RETENTION (15 days by default),
// longer than any profile runs.
func (w *probeWriter) resolve(ctx context.Context, pool *pgxpool.Pool) error {
	var ids []string
	for _, seqs := range w.ledger {
		for _, e := range seqs {
			if e.Maybe {
				ids = append(ids, e.ID)
			}
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := pool.Query(ctx, `SELECT message_id::text FROM outbox_messages WHERE message_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return fmt.Errorf("settling %s's probe transactions of unknown outcome: %w", w.service, err)
	}
	there, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("settling %s's probe transactions of unknown outcome: %w", w.service, err)
	}
	w.settle(there)
	return nil
}

// settle makes every message of a transaction of unknown outcome surely
// committed when one of its messages (ids there) is in the outbox, and
// drops them all when none is.
func (w *probeWriter) settle(there []string) {
	committed := map[int]bool{} // transactions
	for _, seqs := range w.ledger {
		for _, e := range seqs {
			if e.Maybe && slices.Contains(there, e.ID) {
				committed[e.Tx] = true
			}
		}
	}
	for key, seqs := range w.ledger {
		for seq, e := range seqs {
			switch {
			case !e.Maybe:
			case committed[e.Tx]:
				e.Maybe = false
				seqs[seq] = e
			default:
				delete(seqs, seq)
			}
		}
		if len(seqs) == 0 {
			delete(w.ledger, key)
		}
	}
	w.settled = len(committed)
}

// run commits a pair of transactions every probeMeanTick/perSecond
// seconds, so about perSecond messages a second, until ctx ends. Read the
// ledger only after it returned.
func (w *probeWriter) run(ctx context.Context, dbURL string, perSecond float64, say func(string, ...any)) {
	// Its own pool: the checks' pool is not slowed by it, nor it by them.
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		say("probe stream of %s: %v", w.service, err)
		return
	}
	defer pool.Close()
	var gate *standby.Gate
	if w.standbys > 0 {
		if gate, err = standby.New(standby.Config{Pool: pool, Standbys: w.standbys}); err != nil {
			say("probe stream of %s: %v", w.service, err)
			return
		}
	}
	t := time.NewTicker(time.Duration(probeMeanTick / perSecond * float64(time.Second)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keys := w.rng.Perm(probeKeys)[:probeKeysPerTx]
		for range probeTxPerTick {
			w.commitOne(ctx, pool, gate, keys)
		}
	}
}

// outcome is what became of a probe transaction.
type outcome int

const (
	committed  outcome = iota // its COMMIT returned nil
	unknown                   // its COMMIT failed: it may have committed or not
	rolledBack                // it failed before COMMIT, or Postgres answered ROLLBACK: it cannot have committed
)

// commitOne writes one batch and records it by its outcome. The seqs a
// transaction took are never given out again, so one that was rolled back
// and turns up in Kafka is a phantom.
func (w *probeWriter) commitOne(ctx context.Context, pool *pgxpool.Pool, gate *standby.Gate, keys []int) {
	tx := w.committed + w.unknown + w.rolledBack + 1
	batch := w.batch(keys)
	msgs := make([]*message.Message, len(batch))
	for i, p := range batch {
		payload, err := json.Marshal(p)
		if err != nil {
			panic(err) // two plain fields
		}
		msgs[i] = outbox.NewMessage(p.Key, payload)
	}
	// The transaction outlives ctx by up to 10s: stopping the writer must
	// not make its last COMMIT one of unknown outcome.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out := publishProbes(tctx, pool, gate, probeTopic(w.service), msgs)
	switch out {
	case committed:
		w.committed++
	case unknown:
		w.unknown++
	case rolledBack:
		w.rolledBack++
		return
	}
	for i, p := range batch {
		if w.ledger[p.Key] == nil {
			w.ledger[p.Key] = map[int]judge.ProbeEntry{}
		}
		w.ledger[p.Key][p.Seq] = judge.ProbeEntry{ID: msgs[i].UUID, Maybe: out == unknown, Tx: tx}
	}
}

// publishProbes commits msgs to topic in a transaction of their own. It
// does not use pgx.BeginFunc: a failure before COMMIT and a failed COMMIT
// mean different things here. With gate, a commit its standbys did not
// confirm is of unknown outcome: a failover may have taken it back.
func publishProbes(ctx context.Context, pool *pgxpool.Pool, gate *standby.Gate, topic string, msgs []*message.Message) outcome {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return rolledBack
	}
	ticket, err := gate.Mark(ctx, tx) // nothing without a gate
	if err == nil {
		err = outbox.PublishTx(ctx, tx, topic, msgs...)
	}
	if err != nil {
		tx.Rollback(ctx) //nolint:errcheck // nothing was committed, whatever Rollback says
		return rolledBack
	}
	switch err := tx.Commit(ctx); {
	case err == nil && gate.Wait(ctx, ticket) != nil:
		return unknown
	case err == nil:
		return committed
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return rolledBack
	default:
		// The connection died under the COMMIT (a Postgres restart, a
		// timeout): the commit record may have been written or not.
		return unknown
	}
}

// batch takes the next seqs of keys, one or two each, interleaved: every
// key's first, then the second ones (k1/s, k2/t, k3/u, k1/s+1, k3/u+1).
func (w *probeWriter) batch(keys []int) []judge.ProbeMessage {
	var rounds [2][]judge.ProbeMessage
	for _, k := range keys {
		key := fmt.Sprintf("%s%02d", w.prefix, k)
		for i := range 1 + w.rng.IntN(2) {
			rounds[i] = append(rounds[i], judge.ProbeMessage{Key: key, Seq: w.next[k]})
			w.next[k]++
		}
	}
	return append(rounds[0], rounds[1]...)
}

// summary says what the writer committed.
func (w *probeWriter) summary() string {
	return fmt.Sprintf("%s: %d transactions committed, %d of unknown outcome, %d rolled back", probeTopic(w.service), w.committed, w.unknown, w.rolledBack)
}
