package inboxadmin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// A message the consumer cannot handle yet (its handler returns
// inbox.Permanent) is dead-lettered at once, and its partition moves on. An
// operator finds it with Admin.ListQuarantined; once the fix ships,
// Admin.Retry writes it back to its topic through the outbox, the relay
// publishes it, and the consumer applies it.
func ExampleAdmin_Retry() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_shipments;
		CREATE TABLE example_shipments (order_key text NOT NULL, carrier text NOT NULL)`); err != nil {
		panic(err)
	}

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0                      // your brokers' protocol version; Kafka 4 takes 2.1 and later
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest // a new consumer group reads the topic from its start
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	// A topic of its own, so the example can run again on the same broker.
	topic := "example.orders." + watermill.NewShortUUID()

	// The consumer: it ships orders, and knows only schema v1 until the fix.
	var knowsV2 atomic.Bool
	settled := make(chan inbox.Outcome, 10)
	in, err := inbox.New(inbox.Config{
		Pool:      pool,
		Consumer:  "example-shipping", // dead letters go to example-shipping.dlq
		OnOutcome: func(e inbox.Event) { settled <- e.Outcome },
	})
	if err != nil {
		panic(err)
	}
	ship := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if msg.Metadata.Get("schema") == "v2" && !knowsV2.Load() {
			return nil, inbox.Permanent(errors.New("unknown schema v2")) // retrying cannot help
		}
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `INSERT INTO example_shipments VALUES ($1, $2)`,
			msg.Metadata.Get(outbox.KeyMetadata), string(msg.Payload))
		return nil, err
	})
	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           marshaler,
		OverwriteSaramaConfig: conf,
		ConsumerGroup:         "example-shipping",
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("ship", topic, subscriber, func(msg *message.Message) error {
		_, err := ship(msg)
		return err
	})

	// The relay publishes what is written to the outbox: the producer's
	// events, the consumer's dead letters and the messages the operator's Retry
	// writes back. (Producer and consumer share one database and one relay here;
	// in a system each service runs its own.)
	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: conf, Marshaler: marshaler})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		panic(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return relay.Run(runCtx) })
	g.Go(func() error { return in.Run(runCtx) })
	g.Go(func() error { return router.Run(runCtx) })
	next := func() inbox.Outcome {
		select {
		case o := <-settled:
			return o
		case <-ctx.Done():
			panic(ctx.Err())
		}
	}

	// The producer sends the first order in schema v2.
	order := outbox.NewMessage("order-42", []byte("DHL"))
	order.Metadata.Set("schema", "v2")
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.PublishTx(ctx, tx, topic, order) }); err != nil {
		panic(err)
	}
	fmt.Println("delivery:", next())

	admin := inboxadmin.New(pool)
	open, err := admin.ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: "example-shipping"})
	if err != nil {
		panic(err)
	}
	for _, q := range open {
		fmt.Printf("quarantined: %s %s: %s\n", q.Kind, q.Metadata[outbox.KeyMetadata], q.Reason)
	}

	// The fix ships; the operator redrives what was quarantined.
	knowsV2.Store(true)
	for _, q := range open {
		res, err := admin.Retry(ctx, q.ID, "alice")
		if err != nil {
			panic(err)
		}
		fmt.Println("redriven:", res.Redriven)
	}
	fmt.Println("delivery:", next())

	stop()
	if err := g.Wait(); err != nil {
		panic(err)
	}
	var carrier string
	if err := pool.QueryRow(ctx, `SELECT carrier FROM example_shipments WHERE order_key = 'order-42'`).Scan(&carrier); err != nil {
		panic(err)
	}
	fmt.Println("shipped order-42 with", carrier)
	open, err = admin.ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: "example-shipping"})
	if err != nil {
		panic(err)
	}
	fmt.Println("quarantine open:", len(open))
	// Output:
	// delivery: dead_lettered
	// quarantined: dead_letter order-42: permanent error: unknown schema v2
	// redriven: true
	// delivery: applied
	// shipped order-42 with DHL
	// quarantine open: 0
}
