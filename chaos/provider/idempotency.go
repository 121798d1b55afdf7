package provider

// The idempotency keys: claim a key before executing, complete it in the
// transaction that writes the capture or the refund, release it when
// execution failed.
//
// A key is claimed by inserting its row in_progress with a fresh lock
// token (INSERT … ON CONFLICT DO NOTHING: one inserter wins). A second
// request with the key finds the row and gets the stored response (done),
// 409 idempotency_key_in_use (in progress) or 422 (another body). The
// capture or refund is written in one transaction with an UPDATE of the key
// row that requires the holder's token, so that only the holder executes: a
// holder whose key was taken over (it outlived KeyLockTimeout) writes
// nothing. Keys are global: one used for a capture and then for a refund is
// a 422 (the fingerprint covers the path).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

type claimOutcome int

const (
	claimed  claimOutcome = iota // the caller holds the key and executes
	replay                       // done: the stored response
	mismatch                     // the key was used with another request
	inUse                        // another request holds it
)

// claim is what claimKey found.
type claim struct {
	outcome claimOutcome
	token   string // claimed: the lock token that completeKey requires
	status  int    // replay: the stored response
	body    []byte
	origReq string // replay: the request that executed
}

// errLostKey: the key was taken over while its holder executed.
var errLostKey = errors.New("idempotency key taken over by another request")

// claimKey claims key for a request with fingerprint fp, or says why not.
func (p *Provider) claimKey(ctx context.Context, key string, fp []byte, reqID string, now time.Time) (claim, error) {
	token := newID("lock_")
	for range 5 { // a row deleted or taken over between our reads: look again
		tag, err := p.pool.Exec(ctx, `INSERT INTO idempotency_keys
			(key, fingerprint, state, lock_token, locked_at, request_id, created_at)
			VALUES ($1, $2, 'in_progress', $3, $4, $5, $4)
			ON CONFLICT (key) DO NOTHING`, key, fp, token, now, reqID)
		if err != nil {
			return claim{}, fmt.Errorf("claiming key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claim{outcome: claimed, token: token}, nil
		}
		var (
			storedFP           []byte
			state, origReq     string
			oldToken           *string
			lockedAt           *time.Time
			createdAt          time.Time
			status             *int
			body               []byte
			expired, lockStale bool
		)
		err = p.pool.QueryRow(ctx, `SELECT fingerprint, state, lock_token, locked_at, request_id, created_at, response_status, response_body
			FROM idempotency_keys WHERE key = $1`, key).
			Scan(&storedFP, &state, &oldToken, &lockedAt, &origReq, &createdAt, &status, &body)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // released or swept since our insert
		}
		if err != nil {
			return claim{}, fmt.Errorf("reading key: %w", err)
		}
		expired = !now.Before(createdAt.Add(p.cfg.KeyTTL))
		lockStale = state == "in_progress" && lockedAt != nil && !now.Before(lockedAt.Add(p.cfg.KeyLockTimeout))
		switch {
		case expired:
			// A key older than the TTL is as good as swept: the request is new.
			tag, err = p.pool.Exec(ctx, `UPDATE idempotency_keys SET fingerprint = $2, state = 'in_progress',
				lock_token = $3, locked_at = $4, request_id = $5, created_at = $4,
				response_status = NULL, response_body = NULL, capture_id = NULL, refund_id = NULL, finished_at = NULL
				WHERE key = $1 AND created_at = $6`, key, fp, token, now, reqID, createdAt)
		case !bytes.Equal(storedFP, fp):
			return claim{outcome: mismatch}, nil
		case state == "done":
			return claim{outcome: replay, status: *status, body: body, origReq: origReq}, nil
		case lockStale:
			// Its holder is taken to be dead (a crash between claim and
			// capture); the token fences it off should it be alive.
			tag, err = p.pool.Exec(ctx, `UPDATE idempotency_keys SET lock_token = $2, locked_at = $3, request_id = $4
				WHERE key = $1 AND state = 'in_progress' AND lock_token = $5`, key, token, now, reqID, *oldToken)
			if err == nil && tag.RowsAffected() == 1 {
				p.log.Warn("took over a stale idempotency key", "key", key, "held_by", origReq, "locked_at", lockedAt)
			}
		default:
			return claim{outcome: inUse, origReq: origReq}, nil
		}
		if err != nil {
			return claim{}, fmt.Errorf("taking over key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return claim{outcome: claimed, token: token}, nil
		}
	}
	return claim{}, errors.New("claiming key: the row kept changing under us")
}

// completeKey stores res as the response under key, in tx (the
// transaction that wrote what res answers), if token still holds the key:
// errLostKey otherwise, and the caller's transaction must roll back.
func completeKey(ctx context.Context, tx pgx.Tx, key, token string, res result, now time.Time) error {
	tag, err := tx.Exec(ctx, `UPDATE idempotency_keys
		SET state = 'done', lock_token = NULL, response_status = $3, response_body = $4,
			capture_id = NULLIF($5, ''), refund_id = NULLIF($6, ''), finished_at = $7
		WHERE key = $1 AND state = 'in_progress' AND lock_token = $2`,
		key, token, res.status, res.body, res.captureID, res.refundID, now)
	if err != nil {
		return fmt.Errorf("storing the response under the key: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errLostKey
	}
	return nil
}

// releaseKey deletes the claim of a request that failed before its
// effect committed, so a retry runs afresh instead of waiting out the lock.
func (p *Provider) releaseKey(ctx context.Context, key, token string) error {
	_, err := p.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE key = $1 AND state = 'in_progress' AND lock_token = $2`, key, token)
	return err
}

// Sweep deletes the keys older than KeyTTL and returns how many.
func (p *Provider) Sweep(ctx context.Context) (int64, error) {
	tag, err := p.pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE created_at <= $1`, p.cfg.Now().Add(-p.cfg.KeyTTL))
	if err != nil {
		return 0, fmt.Errorf("sweeping keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
