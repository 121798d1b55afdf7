package judge

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/services/events"
)

// PaymentsOnce is the invariant of the third row: the provider's ledger, read
// with SQL against its own database, holds exactly one attempt per
// reserved order (captured, or declined when the order's card declines),
// none for any other order and none for an order that does not exist, each
// for the order's amount, and the order records the outcome the ledger
// holds. An order a person retried after a decline (capture_attempt n)
// may hold up to n attempts: the earlier ones declined, the last one what
// the order records. An order whose capture was refunded (refund.go in
// orders: the order ends rejected) holds its one capture and one refund of
// all of it, the one the order records; no other order holds a refund.
const PaymentsOnce = "payments-once"

// PaymentReport is what PaymentsOnce found.
type PaymentReport struct {
	Captured       int // reserved orders captured once
	Declined       int // reserved orders declined once
	Refunded       int // captured orders refunded once, in full
	CapturedTwice  int // orders with more than one attempt in the ledger
	DoubleCaptures []string
	Invariant      Invariant
}

// ledgerRow is one attempt in the provider's ledger.
type ledgerRow struct {
	id, status, currency, source string
	amount                       int64
}

// paymentRow is an order as orders records its payment.
type paymentRow struct {
	status, card, payment, captureID, refundID string
	amount                                     int64
	attempt                                    int // captures asked for: 1, more after a person's retries
	lines                                      []events.Line
}

// CheckPayments compares the provider's ledger with the orders, once the
// run is quiet: no order paid and unsettled, no capture pending (nothing-
// lost). While captures are still being made, an order reserved and
// captured between the two reads looks like a paid order with a capture.
// The orders are read first, so an attempt for an order that exists is
// never taken for a phantom.
func CheckPayments(ctx context.Context, orders, ledger *pgxpool.Pool) (PaymentReport, error) {
	var r PaymentReport
	ord := map[string]paymentRow{}
	err := snapshot(ctx, orders, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id::text, status, coalesce(amount, -1), card, lines,
			coalesce(payment, ''), coalesce(capture_id, ''), capture_attempt, coalesce(refund_id, '') FROM orders`)
		if err != nil {
			return fmt.Errorf("reading orders' payments: %w", err)
		}
		var id string
		var o paymentRow
		_, err = pgx.ForEachRow(rows, []any{&id, &o.status, &o.amount, &o.card, &o.lines, &o.payment, &o.captureID, &o.attempt, &o.refundID}, func() error {
			ord[id], o = o, paymentRow{}
			return nil
		})
		return err
	})
	if err != nil {
		return r, err
	}
	attempts := map[string][]ledgerRow{}
	refunds := map[string][]refundRow{}
	err = snapshot(ctx, ledger, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT reference, id, capture_id, amount FROM refunds ORDER BY seq`)
		if err != nil {
			return fmt.Errorf("reading the provider's refunds: %w", err)
		}
		var ref string
		var f refundRow
		if _, err = pgx.ForEachRow(rows, []any{&ref, &f.id, &f.captureID, &f.amount}, func() error {
			refunds[ref] = append(refunds[ref], f)
			return nil
		}); err != nil {
			return fmt.Errorf("reading the provider's refunds: %w", err)
		}
		rows, err = tx.Query(ctx, `SELECT reference, id, status, currency, source, amount FROM captures ORDER BY created_at, id`)
		if err != nil {
			return fmt.Errorf("reading the provider's ledger: %w", err)
		}
		var l ledgerRow
		_, err = pgx.ForEachRow(rows, []any{&ref, &l.id, &l.status, &l.currency, &l.source, &l.amount}, func() error {
			attempts[ref] = append(attempts[ref], l)
			return nil
		})
		return err
	})
	if err != nil {
		return r, err
	}

	problems := map[string]string{}
	for ref, list := range attempts {
		if _, ok := ord[ref]; !ok {
			problems[ref] = fmt.Sprintf("the ledger holds %d attempts for an order that does not exist", len(list))
		}
	}
	for ref, list := range refunds {
		if _, ok := ord[ref]; !ok {
			problems[ref] = fmt.Sprintf("the ledger holds %d refunds for an order that does not exist", len(list))
		}
	}
	for id, o := range ord {
		list := attempts[id]
		if captured(list) > 1 || len(list) > 1 && o.attempt == 1 {
			r.CapturedTwice++
			r.DoubleCaptures = append(r.DoubleCaptures, id)
		}
		if p := refundProblem(o, list, refunds[id]); p != "" {
			problems[id] = p
			continue
		}
		if refunding(o) {
			r.Refunded++
			continue
		}
		if p := paymentProblem(o, list); p != "" {
			problems[id] = p
			continue
		}
		switch o.payment {
		case "captured":
			r.Captured++
		case "declined":
			r.Declined++
		}
	}
	sort.Strings(r.DoubleCaptures)
	detail := fmt.Sprintf("%d reserved orders captured once, %d declined once, %d captured and refunded once; %d orders with more than one attempt in the ledger",
		r.Captured, r.Declined, r.Refunded, r.CapturedTwice)
	if len(problems) > 0 {
		detail += fmt.Sprintf("; %d problems: %s", len(problems), examples(problems))
	}
	r.Invariant = Invariant{PaymentsOnce, len(problems) == 0, detail}
	return r, nil
}

// refundRow is one refund in the provider's ledger.
type refundRow struct {
	id, captureID string
	amount        int64
}

// refunding reports whether orders asked for o's capture to be refunded.
func refunding(o paymentRow) bool {
	return o.payment == "refunding" || o.payment == "refunded" || o.payment == "refund_failed"
}

// refundProblem says what is wrong with one order's refund, or "": an
// order orders did not refund holds no refund; one it refunded holds its
// one capture and, refunded, one refund of all of it, the one the order
// records (refund_failed: none).
func refundProblem(o paymentRow, captures []ledgerRow, refunds []refundRow) string {
	if !refunding(o) {
		if len(refunds) > 0 {
			return fmt.Sprintf("%d refunds in the ledger for an order whose payment is %q", len(refunds), o.payment)
		}
		return ""
	}
	var capture *ledgerRow
	for i := range captures {
		if captures[i].status == "captured" {
			if capture != nil {
				return fmt.Sprintf("refunded, captured %d times in the ledger", captured(captures))
			}
			capture = &captures[i]
		}
	}
	switch {
	case capture == nil:
		return fmt.Sprintf("payment %s, and no capture in the ledger", o.payment)
	case capture.id != o.captureID:
		return fmt.Sprintf("the order records capture %q, the ledger holds %s", o.captureID, capture.id)
	case o.payment == "refunding":
		return "its refund still pending"
	case o.payment == "refund_failed" && len(refunds) > 0:
		return fmt.Sprintf("refund_failed, and %d refunds in the ledger", len(refunds))
	case o.payment == "refund_failed":
		return ""
	case len(refunds) != 1:
		return fmt.Sprintf("refunded, %d refunds in the ledger: want exactly one", len(refunds))
	case refunds[0].captureID != capture.id || refunds[0].amount != capture.amount:
		return fmt.Sprintf("the ledger refunded %d of %s, the order's capture is %d of %s", refunds[0].amount, refunds[0].captureID, capture.amount, capture.id)
	case refunds[0].id != o.refundID:
		return fmt.Sprintf("the order records refund %q, the ledger holds %s", o.refundID, refunds[0].id)
	}
	return ""
}

// paymentProblem says what is wrong with one order's payment, or "".
func paymentProblem(o paymentRow, list []ledgerRow) string {
	if o.status != "reserved" {
		if len(list) > 0 || o.payment != "" {
			return fmt.Sprintf("%s order: %d attempts in the ledger, payment %q; only a reserved order is captured", o.status, len(list), o.payment)
		}
		return ""
	}
	want := events.Amount(o.lines)
	switch {
	case o.payment == "capturing":
		return fmt.Sprintf("reserved, its capture still pending (%d attempts in the ledger)", len(list))
	case o.payment == "failed":
		return "reserved, its capture failed for good"
	case o.attempt == 1 && len(list) != 1:
		return fmt.Sprintf("reserved, %d attempts in the ledger: want exactly one", len(list))
	case len(list) == 0 || len(list) > o.attempt:
		return fmt.Sprintf("reserved, %d attempts in the ledger after %d captures asked for: want 1 to %d", len(list), o.attempt, o.attempt)
	case captured(list[:len(list)-1]) > 0:
		return fmt.Sprintf("reserved, captured %d times in the ledger", captured(list))
	case o.amount != want:
		return fmt.Sprintf("the order's amount is %d, its lines cost %d", o.amount, want)
	}
	last := list[len(list)-1] // the order's current attempt
	switch {
	case last.amount != want || last.currency != events.Currency:
		return fmt.Sprintf("the ledger holds %d %s, the order costs %d %s", last.amount, last.currency, want, events.Currency)
	case last.source != o.card:
		return fmt.Sprintf("the ledger charged card %s, the order pays with %s", last.source, o.card)
	case last.status != o.payment:
		return fmt.Sprintf("the ledger says %s, the order says %q", last.status, o.payment)
	case last.id != o.captureID:
		return fmt.Sprintf("the order records capture %q, the ledger holds %s", o.captureID, last.id)
	case (o.payment == "declined") != provider.DeclinedSources[o.card]:
		return fmt.Sprintf("card %s was %s", o.card, o.payment)
	}
	return ""
}

// captured counts the captured attempts of list.
func captured(list []ledgerRow) int {
	n := 0
	for _, l := range list {
		if l.status == "captured" {
			n++
		}
	}
	return n
}
