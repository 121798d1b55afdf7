package effect_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// The three rows in one program, wired the way a service wires them: the
// outbox's relay, the inbox and the effect runner run beside a Watermill
// router in one errgroup, until its context ends. (The example finds
// Postgres in DATABASE_URL and Kafka in KAFKA_BROKERS; under go test,
// TestMain sets both.)
//
// Paying an order is one transaction: the order's row, its OrderPaid in the
// outbox, and the intent to capture its payment. The relay publishes the
// event after the commit; a consumer's inbox reserves stock for it once,
// though Kafka delivers it twice; the runner captures the payment at a
// provider that honours idempotency keys, and records the capture in the
// transaction that ends the effect.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	for _, migrate := range []func(context.Context, *pgxpool.Pool) error{outbox.Migrate, inbox.Migrate, effect.Migrate} {
		if err := migrate(ctx, pool); err != nil {
			panic(err)
		}
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_orders, example_stock;
		CREATE TABLE example_orders (id text PRIMARY KEY, status text NOT NULL, capture text);
		CREATE TABLE example_stock (reserved int NOT NULL); INSERT INTO example_stock VALUES (0)`); err != nil {
		panic(err)
	}

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0                      // your brokers' protocol version; Kafka 4 takes 2.1 and later
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest // a new consumer group reads the topic from its start
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	topic := "example.orders." + watermill.NewShortUUID() // its own, so the example can run again

	// 1. The outbox: a relay publishing what committed.
	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: conf, Marshaler: marshaler})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		panic(err)
	}

	// 2. The inbox: a consumer reserving stock once per OrderPaid.
	settled := make(chan inbox.Outcome, 4)
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "example-stock", OnOutcome: func(e inbox.Event) { settled <- e.Outcome }})
	if err != nil {
		panic(err)
	}
	reserve := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `UPDATE example_stock SET reserved = reserved + 1`)
		return nil, err
	})
	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: marshaler, OverwriteSaramaConfig: conf, ConsumerGroup: "example-stock",
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("reserve", topic, subscriber, func(msg *message.Message) error {
		_, err := reserve(msg)
		return err
	})

	// 3. The effect: a runner capturing payments at a provider that
	// performs each idempotency key once (as Stripe does), however often
	// it is called.
	var (
		mu       sync.Mutex
		captured = map[string]string{} // idempotency key → capture id
	)
	provider := func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := captured[key]; !ok {
			captured[key] = fmt.Sprintf("cap_%d", len(captured)+1)
		}
		return captured[key]
	}
	runner, err := effect.NewRunner(effect.Config[string]{
		Pool: pool, Kind: "capture", PollInterval: 50 * time.Millisecond,
		Do: func(ctx context.Context, e effect.Effect) (string, error) { return provider(e.Key), nil },
		Record: func(ctx context.Context, tx pgx.Tx, e effect.Effect, capture string, err error) error {
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `UPDATE example_orders SET status = 'captured', capture = $2 WHERE id = $1`, string(e.Payload), capture)
			return err
		},
	})
	if err != nil {
		panic(err)
	}

	// All four side by side, until runCtx ends; the first to fail stops
	// the others.
	runCtx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return relay.Run(gctx) })
	g.Go(func() error { return in.Run(gctx) })
	g.Go(func() error { return runner.Run(gctx) })
	g.Go(func() error { return router.Run(gctx) })
	<-router.Running()

	// Paying order-1: the domain change, its event and its effect's intent
	// commit together, or not at all.
	paid := outbox.NewMessage("order-1", []byte("OrderPaid order-1"))
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO example_orders VALUES ('order-1', 'paid', NULL)`); err != nil {
			return err
		}
		if err := outbox.PublishTx(ctx, tx, topic, paid); err != nil {
			return err
		}
		// The key names what asked for the effect: this payment (the run's
		// topic keeps it apart from an earlier run's).
		_, err := effect.EnqueueTx(ctx, tx, "capture", "capture-order-1-"+topic, []byte("order-1"))
		return err
	}); err != nil {
		panic(err)
	}
	next := func() inbox.Outcome {
		select {
		case o := <-settled:
			return o
		case <-ctx.Done():
			panic(ctx.Err())
		}
	}
	fmt.Println("delivery:", next())
	// Kafka delivers at least once: the same message again, as after a
	// consumer died between its commit and its offset's.
	if err := publisher.Publish(topic, paid.Copy()); err != nil {
		panic(err)
	}
	fmt.Println("delivery:", next())

	var reserved int
	var status, capture string
	for status != "captured" {
		if err := pool.QueryRow(ctx, `SELECT reserved, status, coalesce(capture, '') FROM example_stock, example_orders WHERE id = 'order-1'`).Scan(&reserved, &status, &capture); err != nil {
			panic(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := g.Wait(); err != nil {
		panic(err)
	}
	fmt.Println("stock reserved:", reserved)
	fmt.Println("order-1:", status, capture)
	// Output:
	// delivery: applied
	// delivery: duplicate
	// stock reserved: 1
	// order-1: captured cap_1
}
