package dashboard

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// Flow is the system drawn as the stages one order's messages pass through,
// each with how many messages it holds or has passed on, read with SQL and
// (when Options.Brokers is set) from Kafka's offsets:
//
//	orders (paid) → orders' outbox → relay → orders.events → inventory's inbox → inventory (decided)
//	→ inventory's outbox → relay → inventory.events → orders' inbox → orders (settled)
//
// The page draws it and animates the difference between two snapshots.
type Flow struct {
	// Stages by id: the counts the picture shows. An id missing from the
	// map was not readable (its database or Kafka did not answer).
	Stages map[string]int64 `json:"stages"`
	// Pending is each service's outbox rows not yet published.
	Pending map[string]int `json:"pending"`
	// Duplicates is each service's redeliveries its inbox suppressed.
	Duplicates map[string]int64 `json:"duplicates"`
	// Quarantined is each service's open quarantine rows by kind
	// (dead_letter, payload_conflict, invalid): where messages leave the flow.
	Quarantined map[string]map[string]int `json:"quarantined"`
	// Held is each service's keys held behind a dead letter and the
	// messages parked behind them (inbox.HoldKey): out of the flow until a
	// redrive or a discard releases them.
	Held map[string]inboxadmin.HoldCounts `json:"held"`
	// Partitions is each topic's partitions: the end offset (records
	// written) and the offset its consumer group committed (acknowledged).
	Partitions map[string][]Partition `json:"partitions,omitempty"`
}

// Partition is one partition of a topic, read from Kafka.
type Partition struct {
	Partition int32 `json:"partition"`
	End       int64 `json:"end"`   // next offset to be written: the records it holds, from 0
	Acked     int64 `json:"acked"` // the consumer group's committed offset; -1 before its first commit
}

// The stage ids, in the order a message meets them.
const (
	StagePaid            = "orders-paid"       // orders paid (status past 'created')
	StageOrdersOutbox    = "orders-outbox"     // OrderPaid rows in orders' outbox
	StageOrdersRelay     = "orders-relay"      // of those, marked published
	StageOrdersTopic     = "orders-topic"      // records in orders.events (copies included)
	StageInventoryInbox  = "inventory-inbox"   // OrderPaid applied by inventory's inbox
	StageDecided         = "inventory-decided" // orders inventory reserved or rejected
	StageInventoryOutbox = "inventory-outbox"  // answers in inventory's outbox
	StageInventoryRelay  = "inventory-relay"   // of those, marked published
	StageInventoryTopic  = "inventory-topic"   // records in inventory.events
	StageOrdersInbox     = "orders-inbox"      // answers applied by orders' inbox
	StageSettled         = "orders-settled"    // orders reserved or rejected
)

// consumerOf names the service (its inbox consumer and Kafka consumer group)
// that reads each topic.
var consumerOf = map[string]string{events.TopicOrders: "inventory", events.TopicInventory: "orders"}

// readFlow reads the stages from both databases and Kafka. What does not
// answer is left out and named in the returned errors.
func (s *Server) readFlow(ctx context.Context) (Flow, []string) {
	f := Flow{Stages: map[string]int64{}, Pending: map[string]int{}, Duplicates: map[string]int64{},
		Quarantined: map[string]map[string]int{}, Held: map[string]inboxadmin.HoldCounts{}}
	var errs []string
	// Each source has its own deadline: a database that hangs does not
	// take the other's, or Kafka's, time.
	for _, svc := range []struct {
		name, topic string
		pool        *pgxpool.Pool
	}{{"orders", events.TopicOrders, s.opts.Orders}, {"inventory", events.TopicInventory, s.opts.Inventory}} {
		qctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
		if err := readServiceFlow(qctx, svc.pool, svc.name, svc.topic, &f); err != nil {
			errs = append(errs, fmt.Sprintf("flow: %s database: %v", svc.name, err))
		}
		cancel()
	}
	if s.kafka != nil {
		kctx, cancel := context.WithTimeout(ctx, s.opts.QueryTimeout)
		defer cancel()
		parts, err := s.kafka.read(kctx)
		if err != nil {
			errs = append(errs, "flow: kafka: "+err.Error())
		} else {
			f.Partitions = parts
			for topic, stage := range map[string]string{events.TopicOrders: StageOrdersTopic, events.TopicInventory: StageInventoryTopic} {
				var n int64
				for _, p := range parts[topic] {
					n += p.End
				}
				f.Stages[stage] = n
			}
		}
	}
	return f, errs
}

// readServiceFlow reads one service's stages in one statement, so they are
// one moment's counts: its domain stages, its outbox for its own topic, its
// inbox and its open quarantine.
func readServiceFlow(ctx context.Context, pool *pgxpool.Pool, name, topic string, f *Flow) error {
	domain := `(SELECT count(*) FROM decisions), 0::bigint`
	before, after := StageDecided, ""
	if name == "orders" {
		domain = `(SELECT count(*) FROM orders WHERE status <> 'created'),
			(SELECT count(*) FROM orders WHERE status IN ('reserved', 'rejected'))`
		before, after = StagePaid, StageSettled
	}
	var d1, d2, written, published, applied, dups int64
	var pending int
	err := pool.QueryRow(ctx, `
		SELECT `+domain+`,
			count(*), count(published_at), count(*) - count(published_at),
			(SELECT count(*) FROM inbox_messages WHERE consumer = $2 AND status = 'processed'),
			(SELECT coalesce(sum(duplicates), 0) FROM inbox_messages WHERE consumer = $2)
		FROM outbox_messages WHERE topic = $1`, topic, name).
		Scan(&d1, &d2, &written, &published, &pending, &applied, &dups)
	if err != nil {
		return err
	}
	quarantined, err := countBy(ctx, pool, `SELECT kind, count(*) FROM inbox_quarantine WHERE resolved_at IS NULL GROUP BY kind`)
	if err != nil {
		return err
	}
	held, err := inboxadmin.New(pool).HoldStats(ctx, name)
	if err != nil {
		return err
	}
	outbox, relay, in := StageOrdersOutbox, StageOrdersRelay, StageOrdersInbox
	if name == "inventory" {
		outbox, relay, in = StageInventoryOutbox, StageInventoryRelay, StageInventoryInbox
	}
	f.Stages[before] = d1
	if after != "" {
		f.Stages[after] = d2
	}
	f.Stages[outbox], f.Stages[relay], f.Stages[in] = written, published, applied
	f.Pending[name], f.Duplicates[name], f.Quarantined[name], f.Held[name] = pending, dups, quarantined, held
	return nil
}

// offsets reads the two topics' partitions from Kafka with one Sarama client
// kept for the server's life, made at the first read that reaches Kafka (the
// page starts before the broker in docker-compose.yml).
type offsets struct {
	brokers []string
	login   kafkaconf.Credentials // empty: kafkaconf.Sarama()'s
	mu      sync.Mutex
	client  sarama.Client
	admin   sarama.ClusterAdmin
}

func (o *offsets) connect() error {
	if o.admin != nil {
		return nil
	}
	cfg := kafkaconf.Sarama()
	if !o.login.Empty() {
		cfg = kafkaconf.SaramaAs(o.login)
	}
	cfg.ClientID = "outbox-inbox-dashboard"
	cfg.Net.DialTimeout, cfg.Net.ReadTimeout, cfg.Net.WriteTimeout = 2*time.Second, 2*time.Second, 2*time.Second
	cfg.Metadata.Retry.Max = 1
	client, err := sarama.NewClient(o.brokers, cfg)
	if err != nil {
		return err
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close() //nolint:errcheck
		return err
	}
	o.client, o.admin = client, admin
	return nil
}

// read returns every partition's end offset and its consumer group's
// committed offset. Sarama's calls take no context: a read that outlives
// ctx is left to finish on its own (its timeouts are 2s) and reported.
func (o *offsets) read(ctx context.Context) (map[string][]Partition, error) {
	type result struct {
		parts map[string][]Partition
		err   error
	}
	// One read at a time: a caller that finds one in flight (a slow broker)
	// is told so instead of queueing another goroutine behind it.
	if !o.mu.TryLock() {
		return nil, errors.New("the previous read of the offsets has not finished")
	}
	done := make(chan result, 1)
	go func() {
		defer o.mu.Unlock()
		parts, err := o.readLocked()
		done <- result{parts, err}
	}()
	select {
	case r := <-done:
		return r.parts, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("reading offsets: %w", ctx.Err())
	}
}

func (o *offsets) readLocked() (map[string][]Partition, error) {
	if err := o.connect(); err != nil {
		return nil, err
	}
	out := map[string][]Partition{}
	for topic, group := range consumerOf {
		ids, err := o.client.Partitions(topic)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", topic, err)
		}
		committed, err := o.admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ids})
		if err != nil {
			return nil, fmt.Errorf("group %s: %w", group, err)
		}
		for _, id := range ids {
			end, err := o.client.GetOffset(topic, id, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("%s/%d: %w", topic, id, err)
			}
			p := Partition{Partition: id, End: end, Acked: -1}
			if b := committed.GetBlock(topic, id); b != nil && b.Err == sarama.ErrNoError {
				p.Acked = b.Offset
			}
			out[topic] = append(out[topic], p)
		}
		sort.Slice(out[topic], func(i, j int) bool { return out[topic][i].Partition < out[topic][j].Partition })
	}
	return out, nil
}

func (o *offsets) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.admin != nil {
		o.admin.Close() //nolint:errcheck // closes the client too
	}
}
