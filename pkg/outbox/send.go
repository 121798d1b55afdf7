package outbox

import (
	"context"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Sending a claimed batch: rows the broker can never take are parked, and
// the rest are published in runs of one topic, in id order.

// orderKey is what a parked row holds up: its topic and partition key.
type orderKey struct{ topic, key string }

// parking is a row to park, and why.
type parking struct {
	pending
	reason string
}

// sent is what became of a claimed batch.
type sent struct {
	claimed   int
	published int       // acknowledged by the broker
	parked    []parking // refused for good
	unsent    []int64   // not sent: behind a parked row of their key, or stopped by err
	err       error     // the transient failure that stopped the batch, if one did
}

// send publishes batch. A row over MaxMessageBytes is parked without a send.
// When the broker refuses the batch for good, send publishes its rows one at
// a time, in order, to find the refused ones, and parks them. A row behind a
// parked one of its key is not sent. A transient failure stops send; what
// was published before it counts.
func (r *Relay) send(batch []pending) sent {
	res := sent{claimed: len(batch)}
	held := map[orderKey]bool{}
	park := func(p pending, reason string) {
		res.parked = append(res.parked, parking{p, reason})
		if p.key != "" {
			held[orderKey{p.topic, p.key}] = true
		}
	}
	var ready []pending
	for _, p := range batch {
		n := recordBytes(p.msgID, p.meta, len(p.payload))
		switch {
		case held[orderKey{p.topic, p.key}]:
			res.unsent = append(res.unsent, p.id)
		case n > r.cfg.MaxMessageBytes:
			park(p, fmt.Sprintf("message is %d bytes as a Kafka record (payload %d), over the relay's %d-byte MaxMessageBytes",
				n, len(p.payload), r.cfg.MaxMessageBytes))
		default:
			ready = append(ready, p)
		}
	}
	err := r.publish(ready)
	switch {
	case err == nil:
		res.published = len(ready)
		return res
	case !r.cfg.IsPermanent(err):
		res.err = err
		for _, p := range ready {
			res.unsent = append(res.unsent, p.id)
		}
		return res
	}
	// Some row is refused for good: find it, one row at a time.
	for i, p := range ready {
		if held[orderKey{p.topic, p.key}] {
			res.unsent = append(res.unsent, p.id)
			continue
		}
		switch err := r.publish(ready[i : i+1]); {
		case err == nil:
			res.published++
		case r.cfg.IsPermanent(err):
			park(p, "the broker refused it: "+err.Error())
		default:
			res.err = err
			for _, q := range ready[i:] {
				res.unsent = append(res.unsent, q.id)
			}
			return res
		}
	}
	return res
}

// unclaim takes the claim's mark back from the rows res did not publish,
// and parks the refused ones with their reasons. Both statements are
// planned for the table as it is (planEachTime): these are the rare paths,
// and a plan cached while the outbox was nearly empty would scan all of it
// on every failed batch while a broker is down.
func (r *Relay) unclaim(ctx context.Context, tx pgx.Tx, res sent) error {
	if len(res.unsent) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE outbox_messages SET published_at = NULL WHERE id = ANY($1)`, planEachTime, res.unsent); err != nil {
			return fmt.Errorf("releasing unsent rows: %w", err)
		}
	}
	if len(res.parked) == 0 {
		return nil
	}
	ids := make([]int64, len(res.parked))
	reasons := make([]string, len(res.parked))
	for i, p := range res.parked {
		ids[i], reasons[i] = p.id, strings.ToValidUTF8(p.reason, "?")
	}
	_, err := tx.Exec(ctx, `
		UPDATE outbox_messages m SET published_at = NULL, parked_at = now(), park_reason = p.reason
		FROM unnest($1::bigint[], $2::text[]) AS p(id, reason)
		WHERE m.id = p.id AND m.id = ANY($1)`, planEachTime, ids, reasons)
	if err != nil {
		return fmt.Errorf("parking %d rows: %w", len(ids), err)
	}
	return nil
}

// publish sends the rows in id order, one Publish call per run of rows that
// share a topic.
func (r *Relay) publish(batch []pending) error {
	for start := 0; start < len(batch); {
		end := start
		var msgs []*message.Message
		for end < len(batch) && batch[end].topic == batch[start].topic {
			msg := message.NewMessage(batch[end].msgID, batch[end].payload)
			msg.Metadata = batch[end].meta
			msgs = append(msgs, msg)
			end++
		}
		if err := r.cfg.Publisher.Publish(batch[start].topic, msgs...); err != nil {
			return fmt.Errorf("publishing %d messages to %s: %w", len(msgs), batch[start].topic, err)
		}
		start = end
	}
	return nil
}
