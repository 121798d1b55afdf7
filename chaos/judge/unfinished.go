package judge

import (
	"context"
	"fmt"
	"strings"

	"github.com/outboxref/outbox-inbox/services/events"
)

// Stage is one hop of a paid order: an event one service writes to its
// outbox and the other applies.
type Stage string

// The stages a drained run must have reached for every paid order.
const (
	StagePaid     Stage = "OrderPaid"     // orders → inventory
	StageAnswer   Stage = "answer"        // inventory's InventoryReserved or InventoryRejected → orders
	StageCaptured Stage = "OrderCaptured" // orders → inventory: the order ends, its units sold
)

// MissingStage is a stage a paid order did not reach (Report.Missing).
type MissingStage struct {
	Order string
	Stage Stage
}

// route is who writes a stage's event, where, and who consumes it.
func (s Stage) route() (producer, topic, group string, types []string) {
	switch s {
	case StageAnswer:
		return "inventory", events.TopicInventory, "orders", []string{events.TypeInventoryReserved, events.TypeInventoryRejected}
	default:
		return "orders", events.TopicOrders, "inventory", []string{string(s)}
	}
}

// MissingEvent is a missing stage's event as its producer's outbox holds
// it: the message ids of its rows (none: never written) and whether every
// one of them is marked published.
type MissingEvent struct {
	MissingStage
	Topic, Group string
	IDs          []string
	Published    bool
}

// Unfinished tells a run that did not finish from a run that lost
// something: each missing stage's event is followed from its outbox row to
// Kafka and held to its consumer group's committed offset.
type Unfinished struct {
	// Not finished: the event is still on its way.
	NotPublished int // its outbox row is not marked published yet
	InKafka      int // a copy is in Kafka at or past the group's committed offset: not consumed yet (a stalled or slow consumer)
	// Lost: nothing will bring it.
	NoEvent    int // the producer's outbox holds no row for it
	NotInKafka int // its row is marked published and no copy is in Kafka
	PastCommit int // every copy is behind the group's committed offset: the group moved past it without applying it

	Examples []string
}

// NotFinished counts the events still on their way.
func (u Unfinished) NotFinished() int { return u.NotPublished + u.InKafka }

// Lost counts the events nothing will bring.
func (u Unfinished) Lost() int { return u.NoEvent + u.NotInKafka + u.PastCommit }

// String says where the missing events stand, in a sentence.
func (u Unfinished) String() string {
	if u.NotFinished()+u.Lost() == 0 {
		return "nothing missing"
	}
	s := fmt.Sprintf("not finished %d (%d waiting in Kafka past the consumer group's committed offset, %d not yet published); lost %d (%d behind the committed offset, %d marked published and not in Kafka, %d never written)",
		u.NotFinished(), u.InKafka, u.NotPublished, u.Lost(), u.PastCommit, u.NotInKafka, u.NoEvent)
	if len(u.Examples) > 0 {
		s += ": " + strings.Join(u.Examples, "; ")
	}
	return s
}

// ClassifyMissing holds each missing event to what Kafka holds (records,
// every copy) and to where its consumer group stands (lags, the judge's own
// reading of committed offsets).
func ClassifyMissing(missing []MissingEvent, records []Record, lags []PartitionLag) Unfinished {
	type copyAt struct {
		partition int32
		offset    int64
	}
	copies := map[string][]copyAt{}
	for _, r := range records {
		copies[r.ID] = append(copies[r.ID], copyAt{r.Partition, r.Offset})
	}
	committed := map[string]PartitionLag{} // group/topic/partition → its lag
	key := func(group, topic string, p int32) string { return fmt.Sprintf("%s/%s/%d", group, topic, p) }
	for _, l := range lags {
		committed[key(l.Group, l.Topic, l.Partition)] = l
	}
	var u Unfinished
	example := func(format string, args ...any) {
		if len(u.Examples) < maxExamples {
			u.Examples = append(u.Examples, fmt.Sprintf(format, args...))
		}
	}
	for _, m := range missing {
		what := fmt.Sprintf("order %s's %s", m.Order, m.Stage)
		if len(m.IDs) == 0 {
			u.NoEvent++
			example("%s: lost, never written to the outbox", what)
			continue
		}
		if !m.Published {
			u.NotPublished++
			example("%s: not finished, its outbox row is not published", what)
			continue
		}
		var found []copyAt
		for _, id := range m.IDs {
			found = append(found, copies[id]...)
		}
		if len(found) == 0 {
			u.NotInKafka++
			example("%s (%s): lost, marked published and not in %s", what, m.IDs[0], m.Topic)
			continue
		}
		waiting := false
		var at PartitionLag
		for _, c := range found {
			at = committed[key(m.Group, m.Topic, c.partition)]
			at.Group, at.Topic, at.Partition = m.Group, m.Topic, c.partition
			if c.offset >= at.Committed {
				waiting = true
				example("%s: not finished, at %s/%d offset %d; group %s", what, m.Topic, c.partition, c.offset, at)
				break
			}
		}
		if waiting {
			u.InKafka++
			continue
		}
		u.PastCommit++
		example("%s: lost, at %s/%d offset %d behind the committed %d of group %s", what, m.Topic, found[0].partition, found[0].offset, at.Committed, m.Group)
	}
	return u
}

// MissingEvents reads, for each missing stage, its event's rows from the
// producer's outbox.
func MissingEvents(ctx context.Context, db Databases, missing []MissingStage) ([]MissingEvent, error) {
	var out []MissingEvent
	for _, m := range missing {
		producer, topic, group, types := m.Stage.route()
		pool := db.Orders
		if producer == "inventory" {
			pool = db.Inventory
		}
		e := MissingEvent{MissingStage: m, Topic: topic, Group: group, Published: true}
		rows, err := pool.Query(ctx, `SELECT message_id::text, published_at IS NOT NULL FROM outbox_messages
			WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = ANY($3)`, topic, m.Order, types)
		if err != nil {
			return nil, fmt.Errorf("reading %s's outbox: %w", producer, err)
		}
		for rows.Next() {
			var id string
			var published bool
			if err := rows.Scan(&id, &published); err != nil {
				rows.Close()
				return nil, err
			}
			e.IDs = append(e.IDs, id)
			e.Published = e.Published && published
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}
