package inbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// The examples find Postgres in DATABASE_URL and Kafka in KAFKA_BROKERS
// (comma-separated host:port). Under go test, TestMain sets both: a database
// on a throwaway Postgres and an in-process Kafka-protocol broker. Topics are
// created on first use, as Kafka does by default (auto.create.topics.enable).

// The broker delivers a payment twice, as it does when the consumer dies
// after its commit and before the Kafka offset is committed. The account is
// credited once. (The handler is called directly here; see
// ExampleInbox_Handler for a router on Kafka.)
func ExampleInbox_Middleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// The inbox tables, and the outbox that dead letters are published through.
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_wallet;
		CREATE TABLE example_wallet (balance int NOT NULL); INSERT INTO example_wallet VALUES (0)`); err != nil {
		panic(err)
	}

	in, err := inbox.New(inbox.Config{
		Pool:      pool,
		Consumer:  "example-wallet",
		OnOutcome: func(e inbox.Event) { fmt.Println("delivery:", e.Outcome) },
	})
	if err != nil {
		panic(err)
	}
	// The handler writes through the inbox's transaction, which commits
	// together with the inbox row. In a service it is registered with
	// router.AddConsumerHandler(...).AddMiddleware(in.Middleware).
	credit := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		amount, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return nil, inbox.Permanent(fmt.Errorf("reading amount: %w", err)) // retrying cannot help
		}
		tx := inbox.Tx(msg.Context())
		_, err = tx.Exec(msg.Context(), `UPDATE example_wallet SET balance = balance + $1`, amount)
		return nil, err
	})

	// The message id is what the inbox deduplicates on: the producer's
	// (outbox.NewMessage gives each message a fresh UUIDv7).
	id := watermill.NewUUID()
	for range 2 {
		if _, err := credit(message.NewMessage(id, []byte("100"))); err != nil {
			panic(err)
		}
	}

	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM example_wallet`).Scan(&balance); err != nil {
		panic(err)
	}
	stats := in.Stats()
	fmt.Println("balance:", balance)
	fmt.Println("applied:", stats.Applied)
	fmt.Println("duplicates:", stats.Duplicates)
	// Output:
	// delivery: applied
	// delivery: duplicate
	// balance: 100
	// applied: 1
	// duplicates: 1
}

// Run does the inbox's background work (batch transactions, the retention
// sweep) for as long as the consumer runs, beside the router; Running tells
// a readiness check that it has started. ExampleInbox_Handler shows it with
// a router.
func ExampleInbox_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "example-orders", BatchSize: 64})
	if err != nil {
		panic(err)
	}
	fmt.Println("running:", in.Running())

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(runCtx) }()
	// A readiness probe reports in.Running(); here, wait for it.
	for !in.Running() {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("running:", in.Running())

	// ... the router delivers through in.Handler or in.Middleware ...

	// Shutting down: Run returns once the batches it took have committed.
	stop()
	fmt.Println("Run returned:", <-done)
	fmt.Println("running:", in.Running())
	// Output:
	// running: false
	// running: true
	// Run returned: <nil>
	// running: false
}

// A set-based handler behind a Watermill router on Kafka, run the way a
// service runs it: Inbox.Run beside the router. The handler credits a batch
// of payments with one statement; under load, the deliveries that arrive
// together (the router hands over one per partition at a time) form one
// batch and share one transaction. (The few payments here trickle in, so
// each is likely a batch of its own.) A payment delivered twice still counts
// once.
func ExampleInbox_Handler() {
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
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS example_ledger;
		CREATE TABLE example_ledger (balance int NOT NULL); INSERT INTO example_ledger VALUES (0)`); err != nil {
		panic(err)
	}

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0                      // your brokers' protocol version; Kafka 4 takes 2.1 and later
	conf.Producer.Return.Successes = true               // watermill-kafka's publisher waits for each acknowledgement
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest // a new consumer group reads the topic from its start
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)
	// A topic of its own, so the example can run again on the same broker.
	topic := "example.payments." + watermill.NewShortUUID()

	settled := make(chan inbox.Outcome, 10)
	in, err := inbox.New(inbox.Config{
		Pool:      pool,
		Consumer:  "example-ledger",
		BatchSize: 64, // up to 64 deliveries may share a transaction, while Run runs
		OnOutcome: func(e inbox.Event) { settled <- e.Outcome },
	})
	if err != nil {
		panic(err)
	}
	credit := in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		amounts := make([]int32, len(msgs))
		for i, msg := range msgs {
			n, err := strconv.Atoi(string(msg.Payload))
			if err != nil {
				return inbox.Permanent(fmt.Errorf("message %s: reading amount: %w", msg.UUID, err))
			}
			amounts[i] = int32(n)
		}
		_, err := tx.Exec(ctx, `UPDATE example_ledger SET balance = balance + (SELECT sum(a) FROM unnest($1::int[]) AS a)`, amounts)
		return err
	})

	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           marshaler,
		OverwriteSaramaConfig: conf,
		ConsumerGroup:         "example-ledger",
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddConsumerHandler("credit", topic, subscriber, credit)

	// The router and the inbox's background work (its batch transactions and
	// its retention sweep) run side by side until runCtx ends.
	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return in.Run(runCtx) })
	g.Go(func() error { return router.Run(runCtx) })
	select {
	case <-router.Running():
	case <-ctx.Done():
		panic(ctx.Err())
	}

	// Two payments, the first one twice, as a relay that died before marking
	// its batch sends it. (A producer writes them with outbox.PublishTx; they
	// are published directly here.)
	publisher, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             marshaler,
		OverwriteSaramaConfig: conf,
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()
	first := outbox.NewMessage("account-1", []byte("100"))
	second := outbox.NewMessage("account-2", []byte("100"))
	if err := publisher.Publish(topic, first, second, first.Copy()); err != nil {
		panic(err)
	}
	for range 3 {
		select {
		case <-settled:
		case <-ctx.Done():
			panic(ctx.Err())
		}
	}

	stop()
	if err := g.Wait(); err != nil {
		panic(err)
	}
	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM example_ledger`).Scan(&balance); err != nil {
		panic(err)
	}
	stats := in.Stats()
	fmt.Println("balance:", balance)
	fmt.Println("applied:", stats.Applied)
	fmt.Println("duplicates:", stats.Duplicates)
	// Output:
	// balance: 200
	// applied: 2
	// duplicates: 1
}
