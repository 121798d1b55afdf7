package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/internal/ctxtime"
)

// Sharded relays (RelayConfig.Shards > 1; the promise is in doc.go, "Sharded
// relays"). The outbox is divided into shards by a hash of the partition
// key; each shard has one owner at a time, through a lease row in
// outbox_shards (migration 003): owner, fencing token, expiry. A relay's
// lease loop (leaseRound, every LeaseTTL/3) heartbeats, renews the leases
// it holds, gives back those over its fair share and takes free or expired
// ones up to it. Its batches claim only rows of the shards whose lease
// still carries its id and token, and lock those leases FOR SHARE until
// they commit: a takeover (an UPDATE of the lease, SKIP LOCKED) cannot pass
// an open batch, and a relay whose lease was taken claims nothing of the
// shard again.

// shardSQL is the shard of row m among n: a hash of its partition key, or,
// for a row without one (no order to keep), its id, which spreads them.
func shardSQL(n int) string {
	return fmt.Sprintf(`(CASE WHEN m.partition_key = '' THEN (m.id %% %d)::int ELSE (hashtext(m.partition_key) & 2147483647) %% %d END)`, n, n)
}

// leasedSQL is the array of the shards among the leases ($3 owner, $4
// shards, $5 tokens, $6 the shard count) that are still this relay's, locked FOR SHARE in shard
// order (the lease loop locks them in the same order: no deadlock) until
// the transaction ends. Uncorrelated, it runs once per statement.
const leasedSQL = `ARRAY(
		SELECT shard FROM outbox_shards
		WHERE owner = $3 AND shards = $6 AND (shard, token) IN (SELECT * FROM unnest($4::int[], $5::bigint[]))
		ORDER BY shard FOR SHARE)`

// claimShardsSQL is claimSQL for a sharded relay: the lowest sendable ids
// of the shards it still owns. It takes the schema's relay lock shared, so
// it never runs beside an unsharded relay's batch (which takes it
// exclusive), while sharded relays do not exclude each other.
func claimShardsSQL(n int) string {
	return claimOf(`
		SELECT id FROM outbox_messages m
		WHERE ` + sendable + ` AND ` + shardSQL(n) + ` = ANY(` + leasedSQL + `)
		  AND (SELECT pg_try_advisory_xact_lock_shared($2, hashtext(current_schema())))
		ORDER BY id
		LIMIT $1
		FOR UPDATE SKIP LOCKED`)
}

// pendingShardsSQL reports whether a row of the given shards ($1) waits.
func pendingShardsSQL(n int) string {
	return `SELECT EXISTS (SELECT FROM outbox_messages m WHERE ` + sendable + ` AND ` + shardSQL(n) + ` = ANY($1::int[]))`
}

// leases are the shards a relay owns, with their tokens.
type leases struct {
	mu    sync.Mutex
	owned map[int32]int64 // shard → fencing token
	short bool            // under its fair share while shards had no owner
}

// leaseRetry is how soon a relay short of its share looks again for shards
// without an owner.
const leaseRetry = 100 * time.Millisecond

func (l *leases) wanting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.short
}

// started reports whether a lease round ran.
func (l *leases) started() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.owned != nil
}

func (l *leases) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.owned)
}

// snapshot returns the owned shards, in order, and their tokens.
func (l *leases) snapshot() ([]int32, []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	shards := make([]int32, 0, len(l.owned))
	for s := range l.owned {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	tokens := make([]int64, len(shards))
	for i, s := range shards {
		tokens[i] = l.owned[s]
	}
	return shards, tokens
}

func (l *leases) set(owned map[int32]int64) {
	l.mu.Lock()
	l.owned = owned
	l.mu.Unlock()
}

// lease runs the lease loop until ctx ends, then gives the leases back, so
// the other relays take the shards at once instead of after LeaseTTL.
func (r *Relay) lease(ctx context.Context) {
	for {
		// A relay short of its share while a shard has no owner (one was
		// given back, or its owner died) looks again soon: until some relay
		// takes it, that shard's rows wait.
		wait := r.cfg.LeaseTTL / 3
		if r.leases.wanting() {
			wait = min(wait, leaseRetry)
		}
		if !ctxtime.Sleep(ctx, wait) {
			break
		}
		if err := r.leaseRound(ctx); err != nil && ctx.Err() == nil {
			r.cfg.log.Error("Relay lease round failed; shards whose lease expires go to other relays", err,
				watermill.LogFields{"relay": r.cfg.RelayID})
		}
	}
	stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := r.releaseAll(stop); err != nil {
		r.cfg.log.Error("Relay could not give its shards back; they move when their leases expire", err,
			watermill.LogFields{"relay": r.cfg.RelayID})
	}
}

// leaseRound heartbeats, renews this relay's leases, gives back the
// shards over its fair share (ceil(Shards / live relays)) and takes free or
// expired ones up to it.
func (r *Relay) leaseRound(ctx context.Context) error {
	if err := r.ensureShards(ctx); err != nil {
		return err
	}
	ttl := r.cfg.LeaseTTL
	var live, unowned int
	err := r.cfg.Pool.QueryRow(ctx, `
		WITH beat AS (
			INSERT INTO outbox_relays (relay_id, seen_at) VALUES ($1, now())
			ON CONFLICT (relay_id) DO UPDATE SET seen_at = now()),
		gone AS (DELETE FROM outbox_relays WHERE seen_at < now() - 10 * $2::interval AND relay_id <> $1)
		SELECT (SELECT count(*) + 1 FROM outbox_relays WHERE seen_at > now() - $2::interval AND relay_id <> $1),
			(SELECT count(*) FROM outbox_shards WHERE owner IS NULL OR expires_at <= now())`,
		r.cfg.RelayID, ttl).Scan(&live, &unowned)
	if err != nil {
		return fmt.Errorf("relay heartbeat: %w", err)
	}
	shards, tokens := r.leases.snapshot()
	owned, err := r.renew(ctx, shards, tokens)
	if err != nil {
		return err
	}
	share := (r.cfg.Shards + live - 1) / live
	if extra := len(owned) - share; extra > 0 {
		held := make([]int32, 0, len(owned))
		for s := range owned {
			held = append(held, s)
		}
		slices.Sort(held)
		give := held[len(held)-extra:]
		giveTokens := make([]int64, len(give))
		for i, sh := range give {
			giveTokens[i] = owned[sh]
		}
		if err := r.release(ctx, give, giveTokens); err != nil {
			return err
		}
		for _, s := range give {
			delete(owned, s)
		}
	}
	if want := share - len(owned); want > 0 {
		rows, err := r.cfg.Pool.Query(ctx, `
			UPDATE outbox_shards SET owner = $1, token = token + 1, expires_at = now() + $2::interval
			WHERE shard IN (
				SELECT shard FROM outbox_shards WHERE shards = $4 AND (owner IS NULL OR expires_at <= now())
				ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED)
			RETURNING shard, token`, r.cfg.RelayID, ttl, want, r.cfg.Shards)
		if err != nil {
			return fmt.Errorf("taking shards: %w", err)
		}
		taken, err := collectLeases(rows)
		if err != nil {
			return fmt.Errorf("taking shards: %w", err)
		}
		for s, t := range taken {
			owned[s] = t
		}
		if len(taken) > 0 {
			r.cfg.log.Info("Relay took shards", watermill.LogFields{"relay": r.cfg.RelayID, "shards": fmt.Sprint(sortedShards(taken)),
				"owned": len(owned), "fair_share": share, "relays": live})
		}
	}
	r.leases.set(owned)
	r.leases.mu.Lock()
	r.leases.short = len(owned) < share && unowned > 0
	r.leases.mu.Unlock()
	return nil
}

// renew extends the leases whose token is still this relay's and returns
// them: a lease another relay took (its token grew) is gone from the result.
func (r *Relay) renew(ctx context.Context, shards []int32, tokens []int64) (map[int32]int64, error) {
	if len(shards) == 0 {
		return map[int32]int64{}, nil
	}
	// SKIP LOCKED: a lease this relay's own batch holds FOR SHARE is not
	// waited for (a batch may take up to BatchTimeout, longer than a lease
	// round); the read below keeps it, unextended, while its token is ours.
	rows, err := r.cfg.Pool.Query(ctx, `
		UPDATE outbox_shards SET expires_at = now() + $2::interval
		WHERE shard IN (
			SELECT shard FROM outbox_shards
			WHERE owner = $1 AND shards = $5 AND (shard, token) IN (SELECT * FROM unnest($3::int[], $4::bigint[]))
			ORDER BY shard FOR UPDATE SKIP LOCKED)
		RETURNING shard, token`, r.cfg.RelayID, r.cfg.LeaseTTL, shards, tokens, r.cfg.Shards)
	if err != nil {
		return nil, fmt.Errorf("renewing leases: %w", err)
	}
	owned, err := collectLeases(rows)
	if err != nil {
		return nil, fmt.Errorf("renewing leases: %w", err)
	}
	if len(owned) < len(shards) {
		rows, err := r.cfg.Pool.Query(ctx, `
			SELECT shard, token FROM outbox_shards
			WHERE owner = $1 AND shards = $4 AND (shard, token) IN (SELECT * FROM unnest($2::int[], $3::bigint[]))`,
			r.cfg.RelayID, shards, tokens, r.cfg.Shards)
		if err != nil {
			return nil, fmt.Errorf("renewing leases: %w", err)
		}
		held, err := collectLeases(rows)
		if err != nil {
			return nil, fmt.Errorf("renewing leases: %w", err)
		}
		for s, t := range held {
			owned[s] = t
		}
	}
	if lost := len(shards) - len(owned); lost > 0 {
		r.cfg.log.Info("Relay lost shards to another relay", watermill.LogFields{"relay": r.cfg.RelayID, "lost": lost})
	}
	return owned, nil
}

// release gives shards back. A batch of this relay still open on one of
// them holds its lease FOR SHARE: the UPDATE waits for it to commit, so a
// shard changes hands only between batches.
func (r *Relay) release(ctx context.Context, shards []int32, tokens []int64) error {
	// By token too: a relay woken from a pause must not give back what a
	// replacement under the same RelayID took meanwhile.
	_, err := r.cfg.Pool.Exec(ctx, `
		UPDATE outbox_shards SET owner = NULL, expires_at = '-infinity'
		WHERE shard IN (
			SELECT shard FROM outbox_shards
			WHERE owner = $1 AND (shard, token) IN (SELECT * FROM unnest($2::int[], $3::bigint[]))
			ORDER BY shard FOR UPDATE)`, r.cfg.RelayID, shards, tokens)
	if err != nil {
		return fmt.Errorf("giving shards back: %w", err)
	}
	return nil
}

// releaseAll gives every lease back and removes the heartbeat, at shutdown.
func (r *Relay) releaseAll(ctx context.Context) error {
	shards, tokens := r.leases.snapshot()
	r.leases.set(map[int32]int64{})
	if err := r.release(ctx, shards, tokens); err != nil {
		return err
	}
	_, err := r.cfg.Pool.Exec(ctx, `DELETE FROM outbox_relays WHERE relay_id = $1`, r.cfg.RelayID)
	return err
}

// ErrShardCount is returned by Run and RelayOnce when the shard table was
// built for another RelayConfig.Shards than this relay's while other relays
// are alive: relays that disagree on the count would put one key in two
// shards, so this one publishes nothing.
var ErrShardCount = errors.New("outbox: RelayConfig.Shards differs from the running relays'")

// ensureShards makes the lease table hold exactly Shards rows. A different
// count is rebuilt only while no other relay has heartbeat within LeaseTTL
// and no lease is live; the rebuilt rows' tokens start above every earlier
// token, so no (shard, token) a relay remembers matches again.
func (r *Relay) ensureShards(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		var count, wrong int
		if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE shards <> $1) FROM outbox_shards`,
			r.cfg.Shards).Scan(&count, &wrong); err != nil {
			return err
		}
		if count == r.cfg.Shards && wrong == 0 {
			return nil // the common case, every round: no lock taken
		}
		// One relay at a time changes the table.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, shardSetupLockSpace); err != nil {
			return err
		}
		var built, live, others int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(shards), 0),
				count(*) FILTER (WHERE owner IS NOT NULL AND expires_at > now()),
				(SELECT count(*) FROM outbox_relays WHERE relay_id <> $1 AND seen_at > now() - $2::interval)
			FROM outbox_shards`, r.cfg.RelayID, r.cfg.LeaseTTL).Scan(&built, &live, &others); err != nil {
			return err
		}
		if built == r.cfg.Shards {
			return nil // another relay rebuilt it meanwhile
		}
		if live > 0 || others > 0 {
			return fmt.Errorf("%w: it is %d, they run with %d; stop every relay before changing the count", ErrShardCount, r.cfg.Shards, built)
		}
		_, err := tx.Exec(ctx, `
			WITH old AS (DELETE FROM outbox_shards RETURNING token)
			INSERT INTO outbox_shards (shard, shards, token)
			SELECT s, $1, (SELECT coalesce(max(token), 0) + 1 FROM old) FROM generate_series(0, $1 - 1) s`, r.cfg.Shards)
		return err
	})
	if err != nil {
		if errors.Is(err, ErrShardCount) {
			return err
		}
		return fmt.Errorf("outbox shards: %w", err)
	}
	return nil
}

func collectLeases(rows pgx.Rows) (map[int32]int64, error) {
	out := map[int32]int64{}
	var shard int32
	var token int64
	_, err := pgx.ForEachRow(rows, []any{&shard, &token}, func() error {
		out[shard] = token
		return nil
	})
	return out, err
}

func sortedShards(m map[int32]int64) []int32 {
	out := make([]int32, 0, len(m))
	for s := range m {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
