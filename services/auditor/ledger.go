package main

// The stock check: per SKU, what inventory's stock row says it holds
// reserved and sold must be what its reservations and fulfilments add up
// to. Summing every row each round would cost the whole history; instead
// the check keeps a running ledger (audit_stock_ledger, in the auditor's
// database) of the rows up to its watermark, moved with the watermark in
// one transaction, and each round compares, in one snapshot of inventory:
//
//	stock.reserved = ledger + the rows past the watermark (reservations − fulfilments)
//	stock.sold     = ledger + the fulfilments past the watermark
//
// The rows past the watermark are the recent ones (within the grace
// period), read by primary key. A SKU that does not balance is counted in
// full before it is a finding: a ledger that missed a row (one whose
// transaction outlived the grace period, so its id was passed before it
// committed) is corrected from the count, and only a stock row that
// disagrees with its whole history is a finding.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/audit"
)

// KindStockOutOfBalance: a SKU's reserved or sold disagrees with its
// reservations and fulfilments.
const KindStockOutOfBalance = "stock-out-of-balance"

func (d domain) stockCheck() audit.Check {
	return audit.Check{
		Name: "stock",
		Scan: d.scanStock,
		Recheck: func(ctx context.Context, st pgx.Tx, mark audit.Mark, skus []string) ([]audit.Finding, error) {
			var found []audit.Finding
			err := snapshot(ctx, d.inventory, func(tx pgx.Tx) error {
				var err error
				found, err = balance(ctx, tx, st, parseStockMark(mark.Key), skus)
				return err
			})
			return found, err
		},
	}
}

// stockMark is the stock check's watermark: the last reservation and the
// last fulfilment in the ledger.
type stockMark struct{ reservation, fulfilment int64 }

func parseStockMark(key string) stockMark {
	r, f, _ := strings.Cut(key, "/")
	var m stockMark
	m.reservation, _ = strconv.ParseInt(r, 10, 64)
	m.fulfilment, _ = strconv.ParseInt(f, 10, 64)
	return m
}

func (m stockMark) String() string { return fmt.Sprintf("%d/%d", m.reservation, m.fulfilment) }

// scanStock adds the settled rows past the watermark to the ledger and,
// once caught up, balances every SKU.
func (d domain) scanStock(ctx context.Context, st pgx.Tx, from audit.Mark, grace time.Duration, limit int) (audit.Batch, error) {
	m := parseStockMark(from.Key)
	b := audit.Batch{Next: from}
	err := snapshot(ctx, d.inventory, func(tx pgx.Tx) error {
		res, err := settledUnits(ctx, tx, "reservations", m.reservation, grace, limit)
		if err != nil {
			return err
		}
		ful, err := settledUnits(ctx, tx, "fulfilments", m.fulfilment, grace, limit)
		if err != nil {
			return err
		}
		if err := addToLedger(ctx, st, res.units, ful.units); err != nil {
			return err
		}
		next := stockMark{max(m.reservation, res.last), max(m.fulfilment, ful.last)}
		b.Examined = res.rows + ful.rows
		b.Next = audit.Mark{Time: latest(from.Time, res.at, ful.at), Key: next.String()}
		if res.rows == limit || ful.rows == limit {
			return nil // catching up: balanced once the ledger has caught up
		}
		b.Findings, err = balance(ctx, tx, st, next, nil)
		return err
	})
	if err != nil {
		return audit.Batch{Next: from}, err
	}
	return b, nil
}

// tally is what settledUnits read of one table.
type tally struct {
	units map[string]int64 // units per SKU
	rows  int
	last  int64     // the last row's id
	at    time.Time // its time
}

// settledUnits sums, per SKU, the rows of table (reservations or
// fulfilments) after id after, in id order, up to the first one younger
// than grace, at most limit.
func settledUnits(ctx context.Context, tx pgx.Tx, table string, after int64, grace time.Duration, limit int) (tally, error) {
	rows, err := tx.Query(ctx, `SELECT id, sku, quantity, created_at, created_at < now() - make_interval(secs => $2)
		FROM `+table+` WHERE id > $1 ORDER BY id LIMIT $3`, after, seconds(grace), limit)
	if err != nil {
		return tally{}, fmt.Errorf("reading %s: %w", table, err)
	}
	u := tally{units: map[string]int64{}}
	var id int64
	var sku string
	var qty int64
	var at time.Time
	var settled, done bool
	_, err = pgx.ForEachRow(rows, []any{&id, &sku, &qty, &at, &settled}, func() error {
		if done = done || !settled; done {
			return nil
		}
		u.units[sku] += qty
		u.rows++
		u.last, u.at = id, at
		return nil
	})
	if err != nil {
		return tally{}, fmt.Errorf("reading %s: %w", table, err)
	}
	return u, nil
}

func addToLedger(ctx context.Context, st pgx.Tx, res, ful map[string]int64) error {
	skus, rs, fs := ledgerColumns(res, ful)
	if len(skus) == 0 {
		return nil
	}
	_, err := st.Exec(ctx, `INSERT INTO audit_stock_ledger AS l (sku, reservations, fulfilments)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
		ON CONFLICT (sku) DO UPDATE SET reservations = l.reservations + excluded.reservations,
			fulfilments = l.fulfilments + excluded.fulfilments`, skus, rs, fs)
	if err != nil {
		return fmt.Errorf("moving the stock ledger: %w", err)
	}
	return nil
}

func ledgerColumns(res, ful map[string]int64) (skus []string, rs, fs []int64) {
	seen := map[string]bool{}
	for _, m := range []map[string]int64{res, ful} {
		for sku := range m {
			if !seen[sku] {
				seen[sku] = true
				skus, rs, fs = append(skus, sku), append(rs, res[sku]), append(fs, ful[sku])
			}
		}
	}
	return skus, rs, fs
}

// stockLine is one SKU: its stock row, its ledger, the rows past the mark.
type stockLine struct {
	reserved, sold         int64
	ledgerRes, ledgerFul   int64
	tailRes, tailFul       int64
	recountRes, recountFul int64
}

func (s stockLine) balanced() bool {
	return s.reserved == s.ledgerRes+s.tailRes-s.ledgerFul-s.tailFul && s.sold == s.ledgerFul+s.tailFul
}

// balance compares skus' stock rows (nil: every SKU) with the ledger and
// the rows past mark, in inventory's snapshot tx; a SKU that does not
// balance is counted in full, its ledger corrected from the count, and
// compared again.
func balance(ctx context.Context, tx, st pgx.Tx, mark stockMark, skus []string) ([]audit.Finding, error) {
	lines := stockLines{}
	if err := lines.read(ctx, tx, `SELECT sku, reserved, sold FROM stock WHERE $1::text[] IS NULL OR sku = ANY($1)`, []any{skus},
		nil); err != nil {
		return nil, fmt.Errorf("reading stock: %w", err)
	}
	if err := lines.read(ctx, st, `SELECT sku, reservations, fulfilments FROM audit_stock_ledger WHERE $1::text[] IS NULL OR sku = ANY($1)`, []any{skus},
		func(l *stockLine, r, f int64) { l.ledgerRes, l.ledgerFul = r, f }); err != nil {
		return nil, fmt.Errorf("reading the stock ledger: %w", err)
	}
	if err := lines.read(ctx, tx, `SELECT sku, sum(r), sum(f) FROM (
			SELECT sku, quantity::bigint AS r, 0::bigint AS f FROM reservations WHERE id > $1
			UNION ALL SELECT sku, 0, quantity FROM fulfilments WHERE id > $2) t GROUP BY sku`,
		[]any{mark.reservation, mark.fulfilment}, func(l *stockLine, r, f int64) { l.tailRes, l.tailFul = r, f }); err != nil {
		return nil, fmt.Errorf("reading the recent reservations and fulfilments: %w", err)
	}
	var suspects []string
	for sku, l := range lines {
		if !l.balanced() {
			suspects = append(suspects, sku)
		}
	}
	if len(suspects) == 0 {
		return nil, nil
	}
	return lines.recount(ctx, tx, st, suspects)
}

// stockLines are the SKUs a balance compares, by SKU.
type stockLines map[string]*stockLine

// read runs sql, whose rows are (sku, a, b), on q: with set nil, each row
// is a SKU's stock (reserved, sold); else set takes a and b of the SKUs
// already read.
func (lines stockLines) read(ctx context.Context, q pgx.Tx, sql string, args []any, set func(*stockLine, int64, int64)) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	var sku string
	var a, b int64
	_, err = pgx.ForEachRow(rows, []any{&sku, &a, &b}, func() error {
		if set == nil {
			lines[sku] = &stockLine{reserved: a, sold: b}
		} else if l := lines[sku]; l != nil {
			set(l, a, b)
		}
		return nil
	})
	return err
}

// recount counts the suspects in full (one scan of each table, only now),
// sets their ledger to what the rows up to the mark add up to, and returns
// a finding for each that still does not balance.
func (lines stockLines) recount(ctx context.Context, tx, st pgx.Tx, suspects []string) ([]audit.Finding, error) {
	if err := lines.read(ctx, tx, `SELECT sku, sum(r), sum(f) FROM (
			SELECT sku, quantity::bigint AS r, 0::bigint AS f FROM reservations WHERE sku = ANY($1)
			UNION ALL SELECT sku, 0, quantity FROM fulfilments WHERE sku = ANY($1)) t GROUP BY sku`,
		[]any{suspects}, func(l *stockLine, r, f int64) { l.recountRes, l.recountFul = r, f }); err != nil {
		return nil, fmt.Errorf("counting the stock of %d SKUs: %w", len(suspects), err)
	}
	var found []audit.Finding
	var fixSKU []string
	var fixRes, fixFul []int64
	for _, sku := range suspects {
		l := lines[sku]
		res, ful := l.recountRes-l.tailRes, l.recountFul-l.tailFul
		if res != l.ledgerRes || ful != l.ledgerFul {
			slog.Info("stock ledger corrected from a full count", "sku", sku,
				"reservations_was", l.ledgerRes, "reservations", res, "fulfilments_was", l.ledgerFul, "fulfilments", ful)
			l.ledgerRes, l.ledgerFul = res, ful
			fixSKU, fixRes, fixFul = append(fixSKU, sku), append(fixRes, res), append(fixFul, ful)
		}
		if !l.balanced() {
			found = append(found, audit.Finding{Entity: sku, Kind: KindStockOutOfBalance, Detail: fmt.Sprintf(
				"reserved %d, but reservations %d − fulfilments %d = %d; sold %d, fulfilments %d",
				l.reserved, l.recountRes, l.recountFul, l.recountRes-l.recountFul, l.sold, l.recountFul)})
		}
	}
	if len(fixSKU) > 0 {
		if _, err := st.Exec(ctx, `INSERT INTO audit_stock_ledger AS l (sku, reservations, fulfilments)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
			ON CONFLICT (sku) DO UPDATE SET reservations = excluded.reservations, fulfilments = excluded.fulfilments`,
			fixSKU, fixRes, fixFul); err != nil {
			return nil, fmt.Errorf("correcting the stock ledger: %w", err)
		}
	}
	return found, nil
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}
