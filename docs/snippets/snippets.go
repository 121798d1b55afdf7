// Package snippets compiles the Go code the README and the packages' doc.go
// files show: each function below holds one page's code as the page quotes
// it, with what the page leaves out (a pool, a router, a context) declared
// around it. docs/snippets_test.go checks that every Go block of those
// pages appears here, line for line, so a block that no longer compiles
// fails `go vet` and a block edited on the page alone fails the test.
package snippets

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// What the pages take as given.
var (
	pool         *pgxpool.Pool
	router       *message.Router
	subscriber   message.Subscriber
	brokers      []string
	saramaConfig *sarama.Config
	id, sku      string
	orderID      string
	payload      []byte
	g            errgroup.Group
)

type captured struct{ ID string }

func capture(ctx context.Context, e effect.Effect) (captured, error) { return captured{}, nil }

func recordCapture(ctx context.Context, tx pgx.Tx, e effect.Effect, c captured, err error) error {
	return nil
}

// readmeFirst is README.md's first block.
func readmeFirst(ctx context.Context, tx pgx.Tx, ibx *inbox.Inbox) error {
	// Out: the domain change and its event commit together; a relay publishes committed rows.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, id); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, "orders.events", outbox.NewMessage(id, payload))
	})

	// In: the handler writes through the inbox's transaction; a redelivery is skipped,
	// and Kafka's offset is marked only after the commit.
	router.AddConsumerHandler("reserve", "orders.events", subscriber, func(msg *message.Message) error {
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `UPDATE stock SET available = available - 1 WHERE sku = $1`, sku)
		return err
	}).AddMiddleware(ibx.Middleware)

	// Out of the database: the intent commits with the domain; a runner calls with the key.
	_, err = effect.EnqueueTx(ctx, tx, "capture", "capture-"+orderID, payload)
	return err
}

// readmeWiring is README.md's second block.
func readmeWiring(ctx context.Context) {
	publisher, _ := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: saramaConfig, // a batch: one produce request
		Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
	relay, _ := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	go relay.Run(ctx)

	ibx, _ := inbox.New(inbox.Config{Pool: pool, Consumer: "inventory",
		Position: inboxkafka.Position}) // each row records where Kafka holds its message
	go ibx.Run(ctx) // batch transactions and the retention sweep

	runner, _ := effect.NewRunner(effect.Config[captured]{Pool: pool, Kind: "capture",
		Do:     capture,       // func(ctx, e effect.Effect) (captured, error): sends e.Key as the idempotency key
		Record: recordCapture, // func(ctx, tx, e, result, err) error: the outcome, in the tx that ends the effect
	})
	go runner.Run(ctx)
}

func skuOf(*message.Message) string { return sku }

// inboxUse is pkg/inbox/doc.go's "Use".
func inboxUse(ctx context.Context) error {
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "inventory"})
	if err != nil {
		return err
	}
	router.AddConsumerHandler("reserve", "orders.events", subscriber, func(msg *message.Message) error {
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(),
			`UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, skuOf(msg))
		return err // nil: committed, then acked; an error: rolled back, retried, dead-lettered
	}).AddMiddleware(in.Middleware)
	g.Go(func() error { return in.Run(ctx) }) // batches and the retention sweep
	return nil
}

// inboxDeliver is pkg/inbox/doc.go's Deliver.
func inboxDeliver(ctx context.Context, in *inbox.Inbox, client *kgo.Client, record *kgo.Record, msg *message.Message, reserve message.HandlerFunc) error {
	if err := in.Deliver(ctx, record.Topic, msg, reserve); err != nil {
		return err // not settled: leave the offset, the record comes again
	}
	client.CommitRecords(ctx, record)
	return nil
}

// outboxUse is pkg/outbox/doc.go's "Use".
func outboxUse(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, id); err != nil {
			return err
		}
		return outbox.PublishTx(ctx, tx, "orders.events", outbox.NewMessage(id, payload)) // id: the partition key
	})

	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers,
		Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)})
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	g.Go(func() error { return relay.Run(ctx) })
	return err
}

type provider interface {
	Capture(ctx context.Context, key string, payload []byte) (captured, error)
}

func orderOf(e effect.Effect) string { return string(e.Payload) }

// effectUse is pkg/effect/doc.go's code.
func effectUse(ctx context.Context, tx pgx.Tx, provider provider) error {
	_, err := effect.EnqueueTx(ctx, tx, "capture", "capture-"+orderID, payload)

	runner, err := effect.NewRunner(effect.Config[captured]{Pool: pool, Kind: "capture",
		Do: func(ctx context.Context, e effect.Effect) (captured, error) {
			return provider.Capture(ctx, e.Key, e.Payload) // e.Key: the idempotency key
		},
		Record: func(ctx context.Context, tx pgx.Tx, e effect.Effect, c captured, err error) error {
			_, err = tx.Exec(ctx, `UPDATE orders SET capture = $2 WHERE id = $1`, orderOf(e), c.ID)
			return err
		},
	})
	g.Go(func() error { return runner.Run(ctx) })
	return err
}

// inboxkafkaUse is pkg/inbox/inboxkafka/doc.go's code.
func inboxkafkaUse(admin sarama.ClusterAdmin, client sarama.Client, cfg inbox.Config) error {
	if _, err := inboxkafka.CheckRetention(admin, cfg.Retention, "orders.events"); err != nil {
		return err // Kafka can redeliver later than the inbox keeps rows
	}
	cfg.Position = inboxkafka.Position // each row records where Kafka holds its message
	cfg.LogStart = func(ctx context.Context) (inbox.LogStart, error) {
		return inboxkafka.ReadLogStart(client, "orders.events") // rows kept while Kafka holds them
	}
	return nil
}

// inboxadminUse is pkg/inbox/inboxadmin/doc.go's code.
func inboxadminUse(ctx context.Context, tx pgx.Tx, groups []inboxadmin.Group) error {
	adm := inboxadmin.New(pool)
	open, err := adm.ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: "inventory"})
	// ... the handler fixed and deployed:
	res, err := adm.Retry(ctx, open[0].ID, "alice") // written back through the outbox, applied once
	// or, in the caller's transaction, recorded with what else it writes:
	res, err = adm.RetryTx(ctx, tx, open[0].ID, "alice")
	_ = res

	plan, err := adm.DryRun(ctx, inboxadmin.Selection{Consumer: "inventory", Group: groups[0].ID})
	a, err := adm.StartBulk(ctx, inboxadmin.ActionRetry, plan, "alice", "fixed in v1.4.2")
	a, err = adm.RunBulk(ctx, a.ID, inboxadmin.BulkOptions{})
	_ = a
	return err
}

func paidBefore(ctx context.Context, from audit.Mark, before time.Time, limit int) ([]audit.Entity, error) {
	return nil, nil
}

func unanswered(ctx context.Context, ids []string) ([]audit.Finding, error) { return nil, nil }

// auditUse is pkg/audit/doc.go's code.
func auditUse(ctx context.Context, state *pgxpool.Pool) error {
	orders := audit.Entities("orders-answered",
		func(ctx context.Context, from audit.Mark, grace time.Duration, limit int) ([]audit.Entity, error) {
			return paidBefore(ctx, from, time.Now().Add(-grace), limit) // settled orders past the mark, in (time, key) order
		},
		func(ctx context.Context, ids []string) ([]audit.Finding, error) {
			return unanswered(ctx, ids) // a Finding{Entity: id, Kind: "unanswered", Detail: ...} for each that is wrong
		})
	auditor, err := audit.New(state, audit.Config{Grace: time.Minute}, orders)
	g.Go(func() error { return auditor.Run(ctx) }) // a round every Interval; findings in audit_findings
	return err
}
