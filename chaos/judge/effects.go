package judge

// The effect windows (pkg/effect): orders' payment captures, killed on
// either side of the call to the provider. A capture's subject in the
// failpoint log is its idempotency key, capture-<order id>. What happened to
// it:
//
//   - seen again: a later trace line of another orders process about to
//     call the provider with the key (FAILPOINT_TRACE=before-effect);
//   - applied: the attempts the provider's ledger holds for the order (its
//     own database, read with the harness's own SQL): the measure a double
//     capture cannot escape;
//   - caught: the provider's log lines that answered the key with the
//     stored response (Idempotent-Replayed), over the whole run: a replay of
//     an earlier lost answer counts too, so "caught" says the provider
//     replayed the key, and "applied" says it captured once.
//
// With keys on, a kill after the capture (after-effect-before-record) must
// come back as a replay, and no capture may be made twice; with keys off
// (the effect control run) every such kill that was retried must have
// captured twice.

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// effectFacts returns the facts of the effect windows' subjects: a
// capture's key (capture-<order id>) or a refund's (refund-<order id>).
func effectFacts(ctx context.Context, ledger *pgxpool.Pool, providerLog string, l Log) (map[string]subjectFacts, error) {
	facts := map[string]subjectFacts{}
	orderIDs := map[string][]string{} // ledger table → orders
	for _, k := range l.Kills {
		if EffectWindow(k.Window) {
			facts[k.Subject] = subjectFacts{producer: "orders", consumer: "provider"}
			if id, ok := strings.CutPrefix(k.Subject, events.RefundKeyPrefix); ok {
				orderIDs["refunds"] = append(orderIDs["refunds"], id)
			} else {
				orderIDs["captures"] = append(orderIDs["captures"], events.CaptureOrder(k.Subject))
			}
		}
	}
	if len(facts) == 0 {
		return facts, nil
	}
	// The attempts under each key (the harness never retries a declined
	// capture, so a key is an order's one capture; an order is refunded
	// once, whole).
	for table, prefix := range map[string]string{"captures": events.CaptureKeyPrefix, "refunds": events.RefundKeyPrefix} {
		if len(orderIDs[table]) == 0 {
			continue
		}
		if err := countAttempts(ctx, ledger, table, prefix, orderIDs[table], facts); err != nil {
			return nil, err
		}
	}
	replays, err := provider.ReadReplays(providerLog)
	if err != nil {
		return nil, err
	}
	for key, f := range facts {
		f.dups = replays[key]
		facts[key] = f
	}
	return facts, nil
}

// countAttempts adds to facts the rows of the ledger's table (captures or
// refunds) per key for orders: a row without a key counts under the key
// its order's would have been (prefix and the order id).
func countAttempts(ctx context.Context, ledger *pgxpool.Pool, table, prefix string, orders []string, facts map[string]subjectFacts) error {
	rows, err := ledger.Query(ctx,
		`SELECT idempotency_key, count(*)::int FROM `+table+` WHERE reference = ANY($1) AND idempotency_key IS NOT NULL GROUP BY 1
		 UNION ALL
		 SELECT $2 || reference, count(*)::int FROM `+table+` WHERE reference = ANY($1) AND idempotency_key IS NULL GROUP BY reference`,
		orders, prefix)
	if err != nil {
		return fmt.Errorf("reading the provider's %s: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			return err
		}
		if f, ok := facts[key]; ok {
			f.applied += n
			facts[key] = f
		}
	}
	return rows.Err()
}

// EffectVerdict judges the effect windows' rows. keys says whether the
// captures carried their idempotency key. It returns the captures the
// after-effect-before-record kills made twice and the floor they had to
// reach without keys: every kill there whose capture was called again.
func EffectVerdict(rows []WindowRow, keys bool) (ok bool, detail string, doubled, floor int) {
	var bad, notes []string
	for _, r := range rows {
		w := failpoint.Name(r.Window)
		if !EffectWindow(w) {
			continue
		}
		name := r.Window + "/" + r.Service
		own := r.Kills - r.Hostile
		if own > 0 && r.Redelivered == 0 {
			bad = append(bad, fmt.Sprintf("%s: %d kills, no capture called again", name, own))
		}
		if keys && r.AppliedTwice > 0 {
			bad = append(bad, fmt.Sprintf("%s: %d captures made twice with their key", name, r.AppliedTwice))
		}
		if w != failpoint.AfterEffectBeforeRecord {
			notes = append(notes, fmt.Sprintf("%s: %d kills, %d called again, %d captured once", name, own, r.Redelivered, r.AppliedOnce))
			continue
		}
		doubled += r.DoubleByWindow
		floor += r.CopiesMetEffect
		switch {
		case keys && r.CopiesCaught < r.CopiesMetEffect:
			bad = append(bad, fmt.Sprintf("%s: %d captures called again after the provider made them, %d answered with the stored response",
				name, r.CopiesMetEffect, r.CopiesCaught))
		case !keys && r.DoubleByWindow < r.CopiesMetEffect:
			bad = append(bad, fmt.Sprintf("%s: %d captures called again without their key, only %d made twice",
				name, r.CopiesMetEffect, r.DoubleByWindow))
		}
		n, what := r.CopiesCaught, "answered with the stored response"
		if !keys {
			n, what = r.DoubleByWindow, "captured twice"
		}
		notes = append(notes, fmt.Sprintf("%s: %d of %d called again %s", name, n, r.CopiesMetEffect, what))
	}
	if !keys && floor == 0 {
		bad = append(bad, "no capture was called again after the provider made it: the control shows nothing")
	}
	detail = "effects: " + strings.Join(notes, "; ")
	if len(bad) > 0 {
		detail += ": " + strings.Join(bad, "; ")
	}
	return len(bad) == 0, detail, doubled, floor
}
