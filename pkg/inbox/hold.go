package inbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// What a dead letter does to its partition key (Config.OnDeadLetter), as
// one policy the delivery path asks (keyPolicy, in.keys), chosen when the
// Inbox is built: skipKey, the default, only writes the inbox rows;
// holdKey, the key-scoped poison hold whose promise is in doc.go ("Holding
// a poisoned key"), writes them inside the key's hold. The whole hold is in
// this file: the policy, the rows holdKey writes inside the hold (lockHold,
// park, hold, unpark), and what a released key does after the commit;
// skipKey's rows, and the inbox's INSERT beneath both, are in rows.go. The
// path asks the policy at three points, and batch.go at one:
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
// Beside the path, the operator's (package inboxadmin): Admin.Retry marks
// the hold redriven; Admin.Drop writes the first parked message back in the
// dead letter's place.

// holdKey is HoldKey: skipKey's inbox rows, inside the hold of the key. A
// message whose key is empty is never held: skipKey's alone.
type holdKey struct{ skipKey }

// admit locks the hold of d's key first, so that a release sees this
// delivery's parking, or this delivery its release; then writes d's inbox
// row, parked when the key is held by another message. The holder itself is
// admitted, and its commit releases the key. A delivery that releases the
// key, or finds it released, drains it after its commit (d.release,
// afterCommit).
func (h holdKey) admit(ctx context.Context, tx pgx.Tx, d *delivery) (Outcome, string, error) {
	holder, hold, err := h.lockHold(ctx, tx, d)
	if err != nil {
		return "", "", err
	}
	d.release = hold == schema.HoldReleased
	parks := hold != "" && holder != d.id
	status, meta := rowProcessed, []byte(nil)
	if parks {
		status = rowParked // a redelivery is then a duplicate, or a conflict
		if meta, err = metadataJSON(d.msg.Metadata); err != nil {
			return "", "", err
		}
	}
	if settled, reason, err := h.in.insertRow(ctx, tx, d, status); err != nil || settled != "" {
		return settled, reason, err // rows.go: a copy seen before
	}
	switch {
	case parks:
		return h.park(ctx, tx, d, holder, meta)
	case hold != "" && hold != schema.HoldReleased:
		if err := h.setHold(ctx, tx, d, schema.HoldReleased); err != nil {
			return "", "", err
		}
		d.release = true // once committed; a failed attempt finds the key held as before
	}
	return "", "", nil
}

// recordDeadLetter locks the hold of d's key first, as every delivery of
// the key does, then writes the inbox row and the quarantine (skipKey's),
// and holds the key with d as its holder.
func (h holdKey) recordDeadLetter(ctx context.Context, tx pgx.Tx, d *delivery, reason string) (Outcome, string, error) {
	_, state, err := h.lockHold(ctx, tx, d)
	if err != nil {
		return "", "", err
	}
	if d.parked {
		// A released key's parked message: its row is there. Unless
		// another delivery settled it meanwhile, it holds the key again,
		// and the messages parked behind it stay parked.
		if state != schema.HoldReleased {
			return "", "", nil // held again by another: it stays parked
		}
		if ok, err := h.unpark(ctx, tx, d, rowDeadLettered); err != nil || !ok {
			return "", "", err
		}
	}
	settled, seenReason, err := h.skipKey.recordDeadLetter(ctx, tx, d, reason)
	if err != nil || settled != DeadLettered || d.key == "" {
		return settled, seenReason, err
	}
	return settled, "", h.hold(ctx, tx, d)
}

// lockHold reads the hold of d's key and locks its row until tx ends; state
// is "" when the key is not held. Parking, releasing and the dead letter
// that holds a key all lock the row first, so they take turns; a key that
// is not held costs one index lookup and locks nothing (why that is enough
// is in doc.go).
func (h holdKey) lockHold(ctx context.Context, tx pgx.Tx, d *delivery) (holder, state string, err error) {
	if d.key == "" {
		return "", "", nil // a message without a key is never held
	}
	in := h.in
	err = tx.QueryRow(ctx, `SELECT holder, state FROM inbox_held_keys
		WHERE consumer = $1 AND topic = $2 AND partition_key = $3 FOR UPDATE`,
		in.cfg.Consumer, d.topic, d.key).Scan(&holder, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("inbox: reading the hold of key %q: %w", d.key, err)
	}
	return holder, state, nil
}

// setHold moves the hold of d's key to state.
func (h holdKey) setHold(ctx context.Context, tx pgx.Tx, d *delivery, state string) error {
	in := h.in
	if _, err := tx.Exec(ctx, `UPDATE inbox_held_keys SET state = $4, updated_at = now()
		WHERE consumer = $1 AND topic = $2 AND partition_key = $3`, in.cfg.Consumer, d.topic, d.key, state); err != nil {
		return fmt.Errorf("inbox: marking key %q %s: %w", d.key, state, err)
	}
	return nil
}

// hold holds d's key with d as its holder, in the transaction that
// dead-letters d. A key already held by another dead letter keeps that one.
func (h holdKey) hold(ctx context.Context, tx pgx.Tx, d *delivery) error {
	in := h.in
	_, err := tx.Exec(ctx, `
		INSERT INTO inbox_held_keys (consumer, topic, partition_key, holder) VALUES ($1, $2, $3, $4)
		ON CONFLICT (consumer, topic, partition_key) DO UPDATE
		SET holder = EXCLUDED.holder, state = 'held', updated_at = now()
		WHERE inbox_held_keys.state <> 'held' OR inbox_held_keys.holder = EXCLUDED.holder`,
		in.cfg.Consumer, d.topic, d.key, d.id)
	if err != nil {
		return fmt.Errorf("inbox: holding key %q: %w", d.key, err)
	}
	return nil
}

// park writes, in tx, the payload of d, whose inbox row is written as
// parked, and its metadata (meta, as metadataJSON encodes it) in
// inbox_parked, and returns Parked.
func (h holdKey) park(ctx context.Context, tx pgx.Tx, d *delivery, holder string, meta []byte) (Outcome, string, error) {
	in := h.in
	if _, err := tx.Exec(ctx, `
		INSERT INTO inbox_parked (consumer, message_id, topic, partition_key, payload, metadata)
		VALUES ($1, $2, $3, $4, $5, $6)`, in.cfg.Consumer, d.id, d.topic, d.key, d.msg.Payload, meta); err != nil {
		return "", "", fmt.Errorf("inbox: parking: %w", err)
	}
	return Parked, fmt.Sprintf("key %q is held by message %s", d.key, holder), nil
}

// unpark moves p's inbox row from 'parked' to status and deletes its parked
// entry; ok is false when the row was no longer parked.
func (h holdKey) unpark(ctx context.Context, tx pgx.Tx, p *delivery, status string) (ok bool, err error) {
	in := h.in
	tag, err := tx.Exec(ctx, `UPDATE inbox_messages SET status = $3, processed_at = now()
		WHERE consumer = $1 AND message_id = $2 AND status = 'parked'`+in.rowTime(p.id, 4), in.rowArgs(p.id, in.cfg.Consumer, p.id, status)...)
	if err != nil {
		return false, fmt.Errorf("inbox: unparking: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_parked WHERE consumer = $1 AND message_id = $2`, in.cfg.Consumer, p.id); err != nil {
		return false, fmt.Errorf("inbox: unparking: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

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
	return in.applyAndCommit(ctx, tx, p, a) // as any attempt ends
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
