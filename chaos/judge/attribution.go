package judge

// Attribution: what each crash window's kills did, measured per window and
// per service, the hostile messages left out.
//
// For every kill the failpoint log holds the window, the pid and the
// subject the killed code was working on (a message id; an order id for the
// HTTP window). Whether that subject came back after the kill is measured,
// not inferred:
//
//   - a consumer window's message: a later trace line of another process
//     that began to handle the same message id (FAILPOINT_TRACE=before-begin,
//     written at every delivery, before the inbox looks at anything);
//   - a relay window's message: the harness's own Kafka client counts the
//     copies of that message id on its topic (after-claim-before-publish:
//     at least one, sent after the kill; after-publish-before-mark: at
//     least two, the killed relay's and the next relay's), and the trace
//     shows them handed to the consumer (after the kill; twice);
//   - the HTTP window's order: a later trace line of the payment answered
//     again (the client retried);
//   - an effect window's capture (effects.go): a later trace line of another
//     process calling the provider with the same key.
//
// Then, per subject, the consumer's own tables say how often the message
// was applied (reservations and rejections, or order_events, by message
// id), how many copies its inbox suppressed, and how many its domain guard
// refused. A window where the effect was committed before the kill
// (after-commit-before-ack, after-publish-before-mark) is where a copy
// meets a committed effect: with the inbox on it must be suppressed; with
// the inbox off the guard must refuse it; with both off nothing can stop
// it, so every such copy that came back must be applied twice. That last
// number is the control run's floor: the double-applies the crash windows
// alone must produce, hostile messages and random kills left out.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// WindowRow is what one crash window's kills in one service did to the
// subjects they interrupted (Attribution). Every count is measured.
type WindowRow struct {
	Window      string `json:"window"`
	Service     string `json:"service"`         // the killed service ("hostile": the subject was a hostile message)
	Consumer    string `json:"consumer"`        // the service that consumes the subject ("" for dead letters and probe messages)
	Topic       string `json:"topic,omitempty"` // where a subject nobody consumes went: <service>.dlq or <service>.probe
	Kills       int    `json:"kills"`
	Hostile     int    `json:"hostile"`     // of those, on hostile messages: left out of everything below
	Redelivered int    `json:"redelivered"` // subjects seen again after the kill
	AppliedOnce int    `json:"applied_once"`
	// AppliedTwice: subjects applied more than once by their consumer,
	// whatever the cause.
	AppliedTwice int `json:"applied_twice"`
	Suppressed   int `json:"duplicates_suppressed"` // copies of the subjects the inbox suppressed
	Refused      int `json:"refused"`               // copies the domain guard refused
	// Where the effect was committed before the kill: the subjects that came
	// back and so met it, how many of those a layer caught, and how many
	// were applied twice.
	CopiesMetEffect int    `json:"copies_met_effect"`
	CopiesCaught    int    `json:"copies_caught"`
	DoubleByWindow  int    `json:"double_by_window"`
	Note            string `json:"note"`
}

// subjectFacts is what the databases and Kafka say about one subject.
type subjectFacts struct {
	hostile  bool
	producer string // the service whose outbox wrote the message
	consumer string // the service consuming its topic; "" for dead letters
	topic    string
	copies   int // records with this message id in Kafka
	applied  int // applications in the consumer's domain (OrderPaid rows for an order)
	dups     int // copies the consumer's inbox suppressed
	refused  int // copies the consumer's domain guard refused
}

// attribute builds one row per window and killed service from the log and
// the facts. A hostile subject is counted apart and judged nowhere here
// (the hostile table judges it).
func attribute(l Log, facts map[string]subjectFacts) []WindowRow {
	rows := map[string]*WindowRow{}
	var order []string
	for _, k := range l.Kills {
		f, ok := facts[k.Subject]
		service, consumer, topic := "hostile", "", ""
		switch {
		case k.Window == failpoint.AfterCommitBeforeResponse:
			service, consumer = "orders", "orders"
		case EffectWindow(k.Window):
			service, consumer = "orders", "provider"
		case ConsumerWindow(k.Window) && ok && !f.hostile:
			service, consumer = f.consumer, f.consumer
		case ok && !f.hostile:
			service, consumer = f.producer, f.consumer
			if consumer == "" {
				// Nobody consumes it: a dead letter or a probe message
				// (chaos/probe.go), a row of their own per topic.
				topic = f.topic
			}
		}
		key := string(k.Window) + "/" + service + "/" + consumer + "/" + topic
		r := rows[key]
		if r == nil {
			r = &WindowRow{Window: string(k.Window), Service: service, Consumer: consumer, Topic: topic, Note: Windows[k.Window].Note}
			if topic != "" {
				r.Note = Windows[k.Window].Unconsumed
			}
			rows[key] = r
			order = append(order, key)
		}
		r.Kills++
		if !ok || f.hostile {
			r.Hostile++ // a hostile message, or one no outbox wrote
			continue
		}
		// Seen again, and handed to the consumer: a copy still in Kafka when
		// the run stopped has met nothing.
		var again bool
		switch k.Window {
		case failpoint.AfterClaimBeforePublish:
			again = f.copies >= 1 && (f.consumer == "" || l.seenAfter(failpoint.BeforeBegin, k))
		case failpoint.AfterPublishBeforeMark:
			again = f.copies >= 2 && (f.consumer == "" || l.deliveries(k.Subject) >= 2)
		case failpoint.AfterCommitBeforeResponse:
			again = l.seenAfter(failpoint.AfterCommitBeforeResponse, k)
		case failpoint.BeforeEffect, failpoint.AfterEffectBeforeRecord:
			again = l.seenAfter(failpoint.BeforeEffect, k)
		default:
			again = l.consumedAgain(k)
		}
		if again {
			r.Redelivered++
		}
		switch {
		case f.applied == 1:
			r.AppliedOnce++
		case f.applied > 1:
			r.AppliedTwice++
			if again && CommittedBeforeKill(k.Window) {
				r.DoubleByWindow++
			}
		}
		r.Suppressed += f.dups
		r.Refused += f.refused
		if again && CommittedBeforeKill(k.Window) && f.consumer != "" {
			r.CopiesMetEffect++
			if f.dups > 0 || f.refused > 0 {
				r.CopiesCaught++
			}
		}
	}
	out := make([]WindowRow, 0, len(order))
	for _, w := range failpoint.All { // in the order a message meets the windows
		var these []WindowRow
		for _, key := range order {
			if rows[key].Window == string(w) {
				these = append(these, *rows[key])
			}
		}
		slices.SortFunc(these, func(a, b WindowRow) int {
			return strings.Compare(a.Service+"/"+a.Consumer+"/"+a.Topic, b.Service+"/"+b.Consumer+"/"+b.Topic)
		})
		out = append(out, these...)
	}
	return out
}

// WindowsVerdict is the attribution's verdict over every window: the crash
// windows' (AttributionVerdict) and the effect windows' (EffectVerdict).
type WindowsVerdict struct {
	OK     bool
	Detail string
	// The crash windows' double-applies, hostile messages aside, and the
	// floor they must reach with no layer: every copy that met an effect
	// committed before its kill.
	CrashDoubled, CrashFloor int
	// The effect windows' part: whether it held, the captures made twice,
	// and the floor they must reach without keys.
	EffectOK                   bool
	EffectDoubled, EffectFloor int
}

// JudgeWindows judges the rows for the run's mode: which layers were on
// (inbox, guard) and whether captures carried their keys.
func JudgeWindows(rows []WindowRow, inbox, guard, keys bool) WindowsVerdict {
	var v WindowsVerdict
	crashOK, crashDetail, doubled, floor := AttributionVerdict(rows, inbox, guard)
	effectOK, effectDetail, effectDoubled, effectFloor := EffectVerdict(rows, keys)
	v.OK, v.Detail = crashOK && effectOK, crashDetail+"; "+effectDetail
	v.CrashDoubled, v.CrashFloor = doubled, floor
	v.EffectOK, v.EffectDoubled, v.EffectFloor = effectOK, effectDoubled, effectFloor
	return v
}

// AttributionVerdict judges the rows for the run's mode and returns the
// crash windows' double-applies and the floor they had to reach.
func AttributionVerdict(rows []WindowRow, inbox, guard bool) (ok bool, detail string, doubled, floor int) {
	var bad, notes []string
	// Every consumer's after-commit-before-ack window must have been hit:
	// it is the window the inbox exists for.
	for _, svc := range []string{"inventory", "orders"} {
		found := false
		for _, r := range rows {
			if r.Window == string(failpoint.AfterCommitBeforeAck) && r.Service == svc && r.Kills > r.Hostile {
				found = true
			}
		}
		if !found {
			bad = append(bad, fmt.Sprintf("%s: no kill of %s's own messages", failpoint.AfterCommitBeforeAck, svc))
		}
	}
	for _, r := range rows {
		if EffectWindow(failpoint.Name(r.Window)) {
			continue // judged by EffectVerdict
		}
		name := r.Window + "/" + r.Service
		if r.Topic != "" {
			name += "/" + r.Topic
		}
		own := r.Kills - r.Hostile
		if own > 0 && r.Redelivered == 0 {
			bad = append(bad, fmt.Sprintf("%s: %d kills, no subject seen again", name, own))
		}
		doubled += r.AppliedTwice
		if !CommittedBeforeKill(failpoint.Name(r.Window)) || r.Consumer == "" {
			if inbox && r.AppliedTwice > 0 {
				bad = append(bad, fmt.Sprintf("%s: %d applied twice", name, r.AppliedTwice))
			}
			continue
		}
		floor += r.CopiesMetEffect
		switch {
		case inbox:
			// The first layer: each copy meeting a committed effect is
			// suppressed by the inbox, never applied again.
			if r.AppliedTwice > 0 {
				bad = append(bad, fmt.Sprintf("%s: %d applied twice", name, r.AppliedTwice))
			}
			if own > 0 && r.Suppressed == 0 {
				bad = append(bad, fmt.Sprintf("%s: %d kills, no copy suppressed by the inbox", name, own))
			}
		case guard:
			// The second layer alone: each such copy refused by the guard.
			if r.AppliedTwice > 0 || r.CopiesCaught < r.CopiesMetEffect {
				bad = append(bad, fmt.Sprintf("%s: %d copies met a committed effect, %d refused by the guard, %d applied twice",
					name, r.CopiesMetEffect, r.CopiesCaught, r.AppliedTwice))
			}
		default:
			// No layer: each copy that came back is applied again.
			if r.DoubleByWindow < r.CopiesMetEffect {
				bad = append(bad, fmt.Sprintf("%s: %d copies met a committed effect with no layer to stop them, only %d applied twice",
					name, r.CopiesMetEffect, r.DoubleByWindow))
			}
		}
		n := r.CopiesCaught
		if !inbox && !guard {
			n = r.DoubleByWindow
		}
		notes = append(notes, fmt.Sprintf("%s %d/%d", name, n, r.CopiesMetEffect))
	}
	if !inbox && !guard && floor == 0 {
		bad = append(bad, "no copy met a committed effect: the control shows nothing")
	}
	what := "suppressed or refused"
	if !inbox && !guard {
		what = "applied twice"
	}
	detail = fmt.Sprintf("copies that met a committed effect, %s: %s; crash-window double-applies %d (floor %d)",
		what, strings.Join(notes, ", "), doubled, floor)
	if len(bad) > 0 {
		detail += ": " + strings.Join(bad, "; ")
	}
	return len(bad) == 0, detail, doubled, floor
}

// MeasureWindows measures what each crash window's kills did: every kill's
// subject looked up in both services' databases (and, for the effect
// windows, in the provider's ledger and its log of replays at providerLog),
// the relay windows' messages counted among records, what Kafka holds. The
// subjects of hostileIDs are counted apart.
func MeasureWindows(ctx context.Context, db Databases, providerLog string, l Log, hostileIDs map[string]bool, records []Record) ([]WindowRow, error) {
	facts, err := gatherFacts(ctx, db, providerLog, l, hostileIDs, records)
	if err != nil {
		return nil, err
	}
	return attribute(l, facts), nil
}

// gatherFacts looks every kill's subject up.
func gatherFacts(ctx context.Context, db Databases, providerLog string, l Log, hostileIDs map[string]bool, records []Record) (map[string]subjectFacts, error) {
	var ids, orderIDs, relayed []string
	for _, k := range l.Kills {
		switch {
		case k.Window == failpoint.AfterCommitBeforeResponse:
			orderIDs = append(orderIDs, k.Subject)
		case EffectWindow(k.Window):
			// effects.go
		case ConsumerWindow(k.Window):
			ids = append(ids, k.Subject)
		default:
			ids, relayed = append(ids, k.Subject), append(relayed, k.Subject)
		}
	}
	facts, err := effectFacts(ctx, db.Provider, providerLog, l) // effects.go
	if err != nil {
		return nil, err
	}
	orders, inventory := db.Orders, db.Inventory
	for _, id := range ids {
		if hostileIDs[id] {
			facts[id] = subjectFacts{hostile: true}
		}
	}
	// Who wrote each message, and so who consumes it.
	for _, src := range []struct {
		producer string
		pool     *pgxpool.Pool
	}{{"orders", orders}, {"inventory", inventory}} {
		rows, err := src.pool.Query(ctx, `SELECT message_id::text, topic FROM outbox_messages WHERE message_id::text = ANY($1)`, ids)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id, topic string
			if err := rows.Scan(&id, &topic); err != nil {
				return nil, err
			}
			if facts[id].hostile {
				continue
			}
			f := subjectFacts{producer: src.producer, topic: topic}
			switch topic {
			case events.TopicOrders:
				f.consumer = "inventory"
			case events.TopicInventory:
				f.consumer = "orders"
			}
			facts[id] = f
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	// What each consumer did with them.
	queries := map[string][]string{
		"inventory": {
			`SELECT message_id, (count(*) / count(DISTINCT sku))::int FROM reservations WHERE message_id = ANY($1) GROUP BY 1`,
			`SELECT message_id, count(*)::int FROM rejections WHERE message_id = ANY($1) GROUP BY 1`,
			`SELECT message_id, (count(*) / count(DISTINCT sku))::int FROM fulfilments WHERE message_id = ANY($1) GROUP BY 1`,
		},
		"orders": {`SELECT message_id, count(*)::int FROM order_events WHERE message_id = ANY($1) GROUP BY 1`},
	}
	for consumer, pool := range map[string]*pgxpool.Pool{"orders": orders, "inventory": inventory} {
		add := func(q string, field func(*subjectFacts) *int) error {
			rows, err := pool.Query(ctx, q, ids)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id string
				var n int
				if err := rows.Scan(&id, &n); err != nil {
					return err
				}
				if f, ok := facts[id]; ok && f.consumer == consumer {
					*field(&f) += n
					facts[id] = f
				}
			}
			return rows.Err()
		}
		for _, q := range queries[consumer] {
			if err := add(q, func(f *subjectFacts) *int { return &f.applied }); err != nil {
				return nil, err
			}
		}
		if err := add(`SELECT message_id, sum(duplicates)::int FROM inbox_messages WHERE message_id = ANY($1) GROUP BY 1`,
			func(f *subjectFacts) *int { return &f.dups }); err != nil {
			return nil, err
		}
		if err := add(`SELECT message_id, count(*)::int FROM refusals WHERE message_id = ANY($1) GROUP BY 1`,
			func(f *subjectFacts) *int { return &f.refused }); err != nil {
			return nil, err
		}
	}
	// The HTTP window: OrderPaid rows per order.
	rows, err := orders.Query(ctx, `SELECT partition_key, count(*)::int FROM outbox_messages WHERE topic = $1 AND partition_key = ANY($2) AND `+events.OutboxType+` = $3 GROUP BY 1`,
		events.TopicOrders, orderIDs, events.TypeOrderPaid)
	if err != nil {
		return nil, err
	}
	for _, id := range orderIDs {
		facts[id] = subjectFacts{producer: "orders", consumer: "orders"}
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		f := facts[id]
		f.applied = n
		facts[id] = f
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// The relay windows' messages: their copies on their own topic, as the
	// harness's client read them (the events', the dead letters' or the
	// probe streams').
	copies := copiesByID(records)
	for _, id := range relayed {
		if f, ok := facts[id]; ok && f.topic != "" {
			f.copies = copies[f.topic][id]
			facts[id] = f
		}
	}
	return facts, nil
}
