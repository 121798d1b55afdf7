package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// What a dead letter does to its partition key (Config.OnDeadLetter), as
// one policy the delivery path asks (keyPolicy, in.keys), chosen when the
// Inbox is built: skipKey, the default, only writes the inbox rows;
// holdKey, the key-scoped poison hold whose promise is in doc.go ("Holding
// a poisoned key"), writes them inside the key's hold. How each writes a
// delivery's rows is in rows.go; this file holds the policy, and what a
// released key does after the commit. The path (middleware.go) asks the
// policy at three points, and batch.go at one:
//
//	attempt        admit: the inbox row. holdKey locks the key's hold row
//	               first (nothing when the key is not held); a message other
//	               than the holder parks (park); the holder itself is
//	               admitted, and its commit releases the key
//	deadLetter     recordDeadLetter: the inbox row and the quarantine;
//	               holdKey holds the dead letter's key (or holds it again)
//	deliver        afterCommit: a delivery that released the key, or found
//	               it released, drains it: release → nextParked → applyParked,
//	               one parked message per transaction, in arrival order,
//	               through the same retry loop as any delivery
//	batch.go       batchable: a held key's deliveries are left to go alone
//
// Beside the path, admin.go: inboxadmin.Admin.Retry marks the hold redriven;
// inboxadmin.Admin.Drop writes the first parked message back in the dead
// letter's place.

// DeadLetterPolicy is what a dead letter does to the later messages of its
// partition key (Config.OnDeadLetter).
type DeadLetterPolicy int

const (
	// SkipKey applies a dead letter's later messages as they come: the
	// partition goes on, and the dead letter, once redriven, is applied
	// after them. The default.
	SkipKey DeadLetterPolicy = iota
	// HoldKey parks the later messages of a dead letter's key until the
	// dead letter is redriven (and applied) or discarded; then they are
	// applied in their arrival order. Other keys flow.
	HoldKey
)

func (p DeadLetterPolicy) String() string {
	switch p {
	case SkipKey:
		return "skip-key"
	case HoldKey:
		return "hold-key"
	}
	return fmt.Sprintf("DeadLetterPolicy(%d)", int(p))
}

func (s skipKey) batchable(_ context.Context, _ pgx.Tx, items []*batchItem, _ []batchResult) ([]int, error) {
	live := make([]int, len(items))
	for i := range live {
		live[i] = i
	}
	return live, nil
}

func (s skipKey) afterCommit(*delivery, applier) error { return nil }

// afterCommit drains the key d released, or found released (release).
func (h holdKey) afterCommit(d *delivery, a applier) error {
	if !d.release {
		return nil
	}
	return h.release(d, a)
}

// release applies the parked messages of d's key, which d released or found
// released, one at a time in arrival order, each through the retry loop of
// any delivery (retry), applyParked its attempt, with d's applier; it
// returns when none is left (the hold is then gone) or one was
// dead-lettered (the key is held again).
// Another delivery may drain the same key at once (a replica after a
// rebalance): each step locks the hold row and takes the first parked
// message, so each is applied once, in order.
func (h holdKey) release(d *delivery, a applier) error {
	in := h.in
	for {
		next, err := h.nextParked(d)
		if err != nil || next == nil {
			return err
		}
		if _, err := in.retry(next, func(bool) (herr, err error) { return h.applyParked(next, a) }); err != nil {
			return err
		}
	}
}

// nextParked returns the first parked message of d's key as a delivery, or
// nil when the key is no longer released (held again, or gone); when none
// is parked it deletes the hold and returns nil.
func (h holdKey) nextParked(d *delivery) (*delivery, error) {
	in := h.in
	ctx, cancel := in.txContext(d)
	defer cancel()
	var next *delivery
	err := pgx.BeginFunc(ctx, in.cfg.Pool, func(tx pgx.Tx) error {
		_, state, err := h.lockHold(ctx, tx, d)
		if err != nil || state != schema.HoldReleased {
			return err
		}
		// A statement after the lock: it sees what a parking that held the
		// lock committed.
		var id string
		var payload []byte
		var md map[string]string
		err = tx.QueryRow(ctx, `SELECT message_id, payload, metadata FROM inbox_parked
			WHERE consumer = $1 AND topic = $2 AND partition_key = $3 ORDER BY seq LIMIT 1`,
			in.cfg.Consumer, d.topic, d.key).Scan(&id, &payload, &md)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err := tx.Exec(ctx, `DELETE FROM inbox_held_keys WHERE consumer = $1 AND topic = $2 AND partition_key = $3`,
				in.cfg.Consumer, d.topic, d.key)
			return err
		}
		if err != nil {
			return err
		}
		msg := message.NewMessage(id, payload)
		msg.Metadata = md
		msg.SetContext(d.msg.Context()) // the releasing delivery's: its topic, its handler, its trace
		next = &delivery{msg: msg, id: id, topic: d.topic, key: d.key, sum: sha256.Sum256(payload), start: time.Now(), parked: true}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: releasing key %q: %w", d.key, err)
	}
	return next, nil
}

// applyParked is attempt for a parked message: in one transaction it locks
// the hold, checks that p is still the first parked message of a released
// key, marks its inbox row processed, and applies it. Anything else (another
// delivery applied it, or the key was held again) leaves it to that one.
func (h holdKey) applyParked(p *delivery, a applier) (herr, err error) {
	in := h.in
	ctx, cancel := in.txContext(p)
	defer cancel()
	tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	_, state, err := h.lockHold(ctx, tx, p)
	if err != nil || state != schema.HoldReleased {
		return nil, err
	}
	var first string
	if err := tx.QueryRow(ctx, `SELECT message_id FROM inbox_parked
		WHERE consumer = $1 AND topic = $2 AND partition_key = $3 ORDER BY seq LIMIT 1`,
		in.cfg.Consumer, p.topic, p.key).Scan(&first); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("inbox: reading parked messages: %w", err)
	}
	if first != p.id {
		return nil, nil
	}
	if ok, err := h.unpark(ctx, tx, p, rowProcessed); err != nil || !ok {
		if err == nil {
			err = tx.Commit(ctx) // the stray parked entry is gone
		}
		return nil, err
	}
	return in.applyAndCommit(ctx, tx, p, a) // middleware.go, as any attempt ends
}

// batchable marks, in results, the items of a batch whose key is held to be
// tried alone (attempt), where they park or release the key, and returns the
// indexes of the others, which the batch runs. A plain read, no lock: a key
// cannot be held while a delivery of it waits in a batch (see doc.go), and
// one released meanwhile only sends a delivery the long way.
func (h holdKey) batchable(ctx context.Context, tx pgx.Tx, items []*batchItem, results []batchResult) ([]int, error) {
	in := h.in
	live := make([]int, 0, len(items))
	var topics, keys []string
	for i, it := range items {
		live = append(live, i)
		if it.d.key != "" {
			topics, keys = append(topics, it.d.topic), append(keys, it.d.key)
		}
	}
	if len(keys) == 0 {
		return live, nil
	}
	rows, err := tx.Query(ctx, `SELECT h.topic, h.partition_key FROM inbox_held_keys h
		JOIN unnest($2::text[], $3::text[]) AS u(topic, key) ON h.topic = u.topic AND h.partition_key = u.key
		WHERE h.consumer = $1`, in.cfg.Consumer, topics, keys)
	if err != nil {
		return nil, fmt.Errorf("inbox: reading held keys: %w", err)
	}
	held, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var k [2]string
		return k, row.Scan(&k[0], &k[1])
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: reading held keys: %w", err)
	}
	live = live[:0]
	for i, it := range items {
		if it.d.key != "" && slices.Contains(held, [2]string{it.d.topic, it.d.key}) {
			results[i] = batchResult{fallback: true}
			continue
		}
		live = append(live, i)
	}
	return live, nil
}
