package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Claiming. A relay batch is one transaction: it claims the oldest unpublished
// rows (FOR UPDATE SKIP LOCKED, in id order), publishes them, marks them
// published and commits. This file holds the claim and its fence.

// claim locks and marks the next batch of rows, in id order.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx) ([]pending, error) {
	args := []any{planEachTime, r.cfg.BatchSize, relayLockSpace}
	claim := claimSQL
	switch {
	case r.cfg.Parallel:
		claim, args = claimParallelSQL, args[:2]
	case r.cfg.Shards > 1:
		shards, tokens := r.leases.snapshot()
		if len(shards) == 0 {
			return nil, nil // no shard is this relay's now
		}
		claim, args = r.claimShards, append(args, r.cfg.RelayID, shards, tokens, r.cfg.Shards)
	}
	rows, err := tx.Query(ctx, claim, args...)
	if err != nil {
		return nil, fmt.Errorf("claiming rows: %w", err)
	}
	var batch []pending
	for rows.Next() {
		var p pending
		var meta []byte
		if err := rows.Scan(&p.id, &p.msgID, &p.topic, &p.key, &p.payload, &meta); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading row: %w", err)
		}
		p.meta = message.Metadata{}
		if err := json.Unmarshal(meta, &p.meta); err != nil {
			rows.Close()
			return nil, fmt.Errorf("row %d: decoding metadata: %w", p.id, err)
		}
		batch = append(batch, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming rows: %w", err)
	}
	// RETURNING gives no order; the claim took the lowest ids.
	slices.SortFunc(batch, func(a, b pending) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}

// claimSQL locks and marks the lowest sendable ids, up to $1, if this relay
// is the leader of its schema's outbox: the advisory lock ($2, a hash of the
// schema; see relayLockSpace), taken once per statement (an
// uncorrelated subquery is evaluated once, before any row is read), makes
// replicas take turns, so rows leave in id order and one key's messages keep
// their order. A replica that is not the leader claims nothing.
var claimSQL = claimOf(`
		SELECT id FROM outbox_messages m
		WHERE ` + sendable + ` AND (SELECT pg_try_advisory_xact_lock($2, hashtext(current_schema())))
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED`)

// claimParallelSQL is claimSQL without the lock, for RelayConfig.Parallel:
// every replica claims, skipping the rows the others have locked.
var claimParallelSQL = claimOf(`
		SELECT id FROM outbox_messages m
		WHERE ` + sendable + `
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED`)

// claimOf is the statement that marks the rows whose ids the query ids
// locks, and returns them. The query runs once (a materialized CTE). The
// bounds of its ids let a partitioned outbox (partition.go) look for them
// in the partitions that hold them only (Postgres prunes the others when
// the statement runs); on a plain table they are two more bounds of the
// same index scan.
func claimOf(ids string) string {
	return `
	WITH claimed AS MATERIALIZED (` + ids + `)
	UPDATE outbox_messages SET published_at = now()
	WHERE id = ANY(ARRAY(SELECT id FROM claimed))
	  AND id BETWEEN (SELECT min(id) FROM claimed) AND (SELECT max(id) FROM claimed)
	RETURNING id, message_id, topic, partition_key, payload, metadata`
}

// planEachTime, passed before a statement's arguments, has Postgres plan the
// statement for its actual arguments every time (pgx's one-round-trip
// unnamed statement) instead of reusing a prepared statement. A prepared
// statement settles on a generic plan after five executions, and one made
// while outbox_messages was nearly empty, as it is when a service starts,
// scans the table sequentially until the next ANALYZE: under load the mark
// below was seen scanning 8,000 rows for every 50 it marked, ~20 ms a
// batch, and the table only grows until retention. Planning each time costs
// microseconds per batch.
var planEachTime = pgx.QueryExecModeExec

// fencingGrace is how long past BatchTimeout Postgres lets the relay's
// transaction sit idle before it ends the session (see txOptions).
const fencingGrace = time.Second

// txOptions begins the relay's transaction, in one round trip, with:
//
//   - bitmap scans off. Published rows leave dead entries in the pending
//     index until vacuum runs (autovacuum visits a database about once a
//     minute); a bitmap scan visits the heap for every one of them on every
//     claim (seen: 2,800 entries, 180 pages, 7 ms to claim one row), while
//     an index scan in id order stops at LIMIT and marks the dead entries it
//     passes, so the next claim skips them without touching the heap.
//   - the fence. The relay's lead (the advisory lock) and its marks live in
//     this one transaction, so a relay can only commit marks while it still
//     leads. A relay that stops mid-batch (a paused process, a publish that
//     never returns) must not keep the lead: idle_in_transaction_session_
//     timeout ends its session BatchTimeout + fencingGrace after its last
//     statement (the relay itself gives up at BatchTimeout), which frees the
//     lock and the rows for a standby; its marks can then never commit. Its
//     sends still in flight only repeat rows the next leader sends again, in
//     the same order, so a consumer sees duplicates, never a key reordered.
//   - TCP keepalives on the server's side of the socket, so a relay whose
//     host vanished (no FIN, no RST) is found dead within ~11 s instead of
//     the kernel's two hours, with the same effect.
func (r *Relay) txOptions() pgx.TxOptions {
	idle := (r.cfg.BatchTimeout + fencingGrace).Milliseconds()
	return pgx.TxOptions{BeginQuery: fmt.Sprintf(
		"BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL idle_in_transaction_session_timeout = %d; "+
			"SET LOCAL tcp_keepalives_idle = 5; SET LOCAL tcp_keepalives_interval = 2; SET LOCAL tcp_keepalives_count = 3", idle)}
}

type pending struct {
	id      int64
	msgID   string
	topic   string
	key     string
	payload []byte
	meta    message.Metadata
}

// ErrIDCache is returned by Run when outbox_messages's id sequence hands out
// ids from a cache (CACHE above 1).
var ErrIDCache = errors.New("outbox: outbox_messages's id sequence caches ids (CACHE above 1)")

// checkIDSequence refuses an id sequence that caches ids. The relay sends
// rows in id order, and a key's messages keep their commit order because
// each producer takes its id while it holds the key's lock (PublishTx). A
// cache hands each session a range of ids at its first insert, so a
// producer that commits later can hold a lower id than one that committed
// before it, and a key's messages would leave out of order. A DBA may set
// it for the insert rate; the relay says so at start instead of reordering.
// err is Postgres not answering.
func (r *Relay) checkIDSequence(ctx context.Context) (refused, err error) {
	var seq string
	var cache int64
	err = r.cfg.Pool.QueryRow(ctx, `
		SELECT coalesce(s.seqrelid::regclass::text, ''), coalesce(s.seqcache, 1)
		FROM (SELECT pg_get_serial_sequence('outbox_messages', 'id')) AS n(name)
		LEFT JOIN pg_sequence s ON s.seqrelid = n.name::regclass`).Scan(&seq, &cache)
	switch {
	case err != nil:
		return nil, fmt.Errorf("outbox: reading outbox_messages's id sequence: %w", err)
	case cache > 1:
		return fmt.Errorf("%w: %s has CACHE %d; a key's messages would leave out of order: "+
			"ALTER SEQUENCE %s CACHE 1", ErrIDCache, seq, cache, seq), nil
	}
	return nil, nil
}
