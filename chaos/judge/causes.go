package judge

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/services/events"
)

// effectsHaveCauses holds every effect to a committed cause, in both
// directions between the services:
//
//   - inventory → orders: every order with a reservation, a rejection or a
//     decision in inventory is paid in orders (a reservation for an order
//     nobody paid, or that does not exist, is a phantom);
//   - within inventory: where the domain guard recorded a decision, the
//     rows agree with it (reserved: reservations and no rejection;
//     rejected: the reverse; ended: fulfilments);
//   - inventory → orders: an order inventory ended (fulfilments: its units
//     sold) was reserved in inventory and captured in orders;
//   - orders → inventory: every answer orders applied (order_events) and
//     every settled status is what inventory decided: reserved only with
//     reservations, rejected only with a rejection;
//   - within orders: every OrderPaid in the outbox belongs to a paid order,
//     every OrderCaptured to an order whose payment was captured, and an
//     answer was applied only to an order that was paid.
//
// inventory's view was read before orders'; an answer orders applied may
// come from a decision taken between the two reads, so an answer that
// inventory's view cannot explain is looked up in inventory again before it
// counts as a phantom.
// injected are orders a harness paid to inject a wrong answer: the answer
// orders applied to them is the breach injected, judged by its outcome.
func effectsHaveCauses(ctx context.Context, inventory *pgxpool.Pool, ord ordersView, inv inventoryView, injected map[string]bool) (Invariant, error) {
	problems := map[string]string{} // order id → what is wrong
	effects := inv.effectOrders()
	for _, id := range effects {
		if p := inventoryEffect(id, ord.orders[id], inv); p != "" {
			problems[id] = p
		}
	}
	for _, id := range sortedKeys(ord.orderPaid) {
		if o := ord.orders[id]; o == nil || !o.paid() {
			problems[id] = join(problems[id], fmt.Sprintf("%d OrderPaid in the orders outbox, but %s", ord.orderPaid[id], describe(o)))
		}
	}
	for _, id := range sortedKeys(ord.orderCaptured) {
		if o := ord.orders[id]; o == nil || !o.captured() {
			what := "orders has no such order"
			if o != nil {
				what = fmt.Sprintf("its payment is %q", o.payment)
			}
			problems[id] = join(problems[id], fmt.Sprintf("%d OrderCaptured in the orders outbox, but %s", ord.orderCaptured[id], what))
		}
	}

	var suspects []string
	for _, id := range ord.ids() {
		if !injected[id] && answerProblem(ord.orders[id], inv.reservationRows(id), inv.rejections[id]) != "" {
			suspects = append(suspects, id)
		}
	}
	if len(suspects) > 0 {
		reserved, err := countBy(ctx, inventory, `SELECT order_id, count(*) FROM reservations WHERE order_id = ANY($1) GROUP BY 1`, suspects)
		if err != nil {
			return Invariant{}, err
		}
		rejected, err := countBy(ctx, inventory, `SELECT order_id, count(*) FROM rejections WHERE order_id = ANY($1) GROUP BY 1`, suspects)
		if err != nil {
			return Invariant{}, err
		}
		for _, id := range suspects {
			if p := answerProblem(ord.orders[id], reserved[id], rejected[id]); p != "" {
				problems[id] = join(problems[id], p)
			}
		}
	}

	settled := 0
	for _, o := range ord.orders {
		if o.status == "reserved" || o.status == "rejected" {
			settled++
		}
	}
	detail := fmt.Sprintf("%d orders with effects in inventory, each paid in orders; %d settled orders, each as inventory decided", len(effects), settled)
	if len(problems) > 0 {
		detail = fmt.Sprintf("%d orders with effects that have no committed cause: %s", len(problems), examples(problems))
	}
	return Invariant{EffectsHaveCauses, len(problems) == 0, detail}, nil
}

// inventoryEffect says what is wrong with inventory's effects on order id,
// or "". o is the order as orders has it, nil when it has none.
func inventoryEffect(id string, o *order, inv inventoryView) string {
	res, rej, dec := inv.reservationRows(id), inv.rejections[id], inv.decisions[id]
	var what []string
	if res > 0 {
		what = append(what, fmt.Sprintf("%d reservation rows", res))
	}
	if rej > 0 {
		what = append(what, fmt.Sprintf("%d rejections", rej))
	}
	if dec != "" {
		what = append(what, "decided "+dec)
	}
	var wrong []string
	if o == nil || !o.paid() {
		wrong = append(wrong, describe(o))
	}
	ful := inv.fulfilmentRows(id)
	if ful > 0 {
		what = append(what, fmt.Sprintf("%d fulfilment rows", ful))
		if o != nil && o.payment != "captured" {
			wrong = append(wrong, fmt.Sprintf("orders has its payment %q, not captured: sold without a sale", o.payment))
		}
		if res == 0 {
			wrong = append(wrong, "sold without a reservation")
		}
	}
	switch {
	case dec == "reserved" && (res == 0 || rej > 0), dec == "rejected" && (rej == 0 || res > 0),
		inv.ended[id] != (ful > 0) && dec != "":
		wrong = append(wrong, "its rows contradict its decision")
	}
	if len(wrong) == 0 {
		return ""
	}
	return "inventory has " + strings.Join(what, ", ") + ", but " + strings.Join(wrong, "; ")
}

// answerProblem says what is wrong with the answers orders applied to o,
// given how many reservation and rejection rows inventory has for it, or "".
func answerProblem(o *order, reservations, rejections int) string {
	var wrong []string
	if o.answerCount() > 0 && o.status != "reserved" && o.status != "rejected" {
		wrong = append(wrong, fmt.Sprintf("orders applied %d answers to it while it is %s", o.answerCount(), o.status))
	}
	if n := o.answers[events.TypeInventoryReserved]; n > 0 && reservations == 0 {
		wrong = append(wrong, fmt.Sprintf("orders applied %d InventoryReserved, but inventory reserved nothing for it", n))
	}
	if n := o.answers[events.TypeInventoryRejected]; n > 0 && rejections == 0 {
		wrong = append(wrong, fmt.Sprintf("orders applied %d InventoryRejected, but inventory never rejected it", n))
	}
	switch {
	case o.status == "reserved" && reservations == 0:
		wrong = append(wrong, "orders has it reserved, but inventory reserved nothing for it")
	case o.status == "rejected" && rejections == 0:
		wrong = append(wrong, "orders has it rejected, but inventory never rejected it")
	}
	if (o.status == "reserved" || o.status == "rejected") && o.answers[answerFor(o.status)] == 0 {
		wrong = append(wrong, fmt.Sprintf("orders has it %s without applying %s", o.status, answerFor(o.status)))
	}
	return strings.Join(wrong, "; ")
}

// answerFor is the event that settles an order with status.
func answerFor(status string) string {
	if status == "reserved" {
		return events.TypeInventoryReserved
	}
	return events.TypeInventoryRejected
}

// describe says how orders has an order that should be paid: "orders has
// no such order" or "orders has it created (never paid)".
func describe(o *order) string {
	if o == nil {
		return "orders has no such order"
	}
	return fmt.Sprintf("orders has it %s (never paid)", o.status)
}

// quantities holds every reservation to its order's lines: each time
// inventory applied an order, it wrote one row per SKU of the order with
// the order's quantity of that SKU (its lines summed). So every row of an
// order and SKU holds exactly that quantity, no row names a SKU the order
// does not have, and every SKU of the order has as many rows as the others
// (fewer is a partial reservation). Likewise each fulfilment (the order
// ended, its units sold) sells exactly the order's lines. Reserving or
// selling twice is exactly-once's to catch; orders that orders does not
// have are effectsHaveCauses'.
func quantities(ord ordersView, inv inventoryView) Invariant {
	problems := map[string]string{}
	checked := 0
	for _, id := range sortedKeys(inv.reservations) {
		o := ord.orders[id]
		if o == nil {
			continue
		}
		checked++
		got := inv.reservations[id]
		times := 0 // how many times the order was reserved: rows per SKU
		for _, s := range got {
			times = max(times, s.rows)
		}
		var wrong []string
		for _, sku := range sortedKeys(got) {
			s := got[sku]
			want, ok := o.lines[sku]
			switch {
			case !ok:
				wrong = append(wrong, fmt.Sprintf("%s reserved %d, the order has no such line", sku, s.quantity))
			case s.least != want || s.most != want:
				wrong = append(wrong, fmt.Sprintf("%s reserved %d in %d rows, the order's lines say %d", sku, s.quantity, s.rows, want))
			}
		}
		for _, sku := range sortedKeys(o.lines) {
			if n := got[sku].rows; n < times {
				wrong = append(wrong, fmt.Sprintf("%s reserved %d times, the order's other SKUs %d", sku, n, times))
			}
		}
		if len(wrong) > 0 {
			problems[id] = strings.Join(wrong, ", ")
		}
	}
	ended := 0
	for _, id := range sortedKeys(inv.fulfilments) {
		o := ord.orders[id]
		if o == nil {
			continue
		}
		ended++
		var wrong []string
		got := inv.fulfilments[id]
		times := 0 // how many times the order was sold: rows per SKU
		for _, s := range got {
			times = max(times, s.rows)
		}
		for _, sku := range sortedKeys(o.lines) {
			if n := got[sku].rows; n < times {
				wrong = append(wrong, fmt.Sprintf("%s sold %d times, the order's other SKUs %d", sku, n, times))
			}
		}
		for _, sku := range sortedKeys(got) {
			if s, want := got[sku], o.lines[sku]; s.least != want || s.most != want {
				wrong = append(wrong, fmt.Sprintf("%s sold %d in %d rows, the order's lines say %d", sku, s.quantity, s.rows, want))
			}
		}
		if len(wrong) > 0 {
			problems[id] = join(problems[id], strings.Join(wrong, ", "))
		}
	}
	detail := fmt.Sprintf("%d reserved orders, each reserving exactly its lines; %d ended, each selling exactly its lines", checked, ended)
	if len(problems) > 0 {
		detail = fmt.Sprintf("%d of %d orders reserve or sell other than their lines: %s", len(problems), checked, examples(problems))
	}
	return Invariant{Quantities, len(problems) == 0, detail}
}

// examples quotes up to maxExamples problems, by order id.
func examples(problems map[string]string) string {
	ids := sortedKeys(problems)
	quoted := make([]string, 0, maxExamples)
	for _, id := range ids[:min(maxExamples, len(ids))] {
		quoted = append(quoted, fmt.Sprintf("order %s: %s", id, problems[id]))
	}
	s := strings.Join(quoted, "; ")
	if len(ids) > maxExamples {
		s += fmt.Sprintf("; and %d more", len(ids)-maxExamples)
	}
	return s
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
