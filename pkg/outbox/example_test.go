package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
)

// The examples find Postgres in DATABASE_URL and Kafka in KAFKA_BROKERS
// (comma-separated host:port). Under go test, TestMain sets both: a database
// on a throwaway Postgres and an in-process Kafka-protocol broker.

// Example writes an order and its OrderPlaced event in one transaction, then
// runs one relay batch, which publishes the event to Kafka and marks its row.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_orders (id bigserial PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}

	// The order and its event commit together, or not at all.
	var event *message.Message
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO example_orders (total_cents) VALUES (1999) RETURNING id`).Scan(&id); err != nil {
			return err
		}
		// The order id is the partition key: one order's events stay in order.
		event = outbox.NewMessage(fmt.Sprint("order-", id), fmt.Appendf(nil, `{"order_id":%d,"total_cents":1999}`, id))
		return outbox.PublishTx(ctx, tx, "example.orders", event)
	})
	if err != nil {
		panic(err)
	}

	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0 // your brokers' protocol version; Kafka 4 takes 2.1 and later
	publisher, err := outboxkafka.New(outboxkafka.Config{
		Brokers:   strings.Split(os.Getenv("KAFKA_BROKERS"), ","),
		Sarama:    conf,
		Marshaler: kafka.NewWithPartitioningMarshaler(outbox.PartitionKey),
	})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()

	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		panic(err)
	}
	// A service runs relay.Run(ctx) (see ExampleRelay_Run); one batch is
	// enough here.
	if _, err := relay.RelayOnce(ctx); err != nil {
		panic(err)
	}

	var published bool
	if err := pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM outbox_messages WHERE message_id = $1`, event.UUID).Scan(&published); err != nil {
		panic(err)
	}
	fmt.Println("published:", published)

	// Output:
	// published: true
}

// ExamplePublishTx shows that an event written in a transaction that rolls
// back is never stored, so it can never be published.
func ExamplePublishTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	// A topic of its own, so that the rows listed below are this run's.
	topic := "example.payments." + watermill.NewShortUUID()

	errDeclined := errors.New("card declined")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("payment-1", []byte(`{"status":"captured"}`))); err != nil {
			return err
		}
		return errDeclined // a later step fails: the transaction rolls back
	})
	fmt.Println("transaction:", err)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("payment-1", []byte(`{"status":"declined"}`)))
	})
	if err != nil {
		panic(err)
	}

	rows, err := pool.Query(ctx, `SELECT partition_key, convert_from(payload, 'UTF8') FROM outbox_messages WHERE topic = $1 ORDER BY id`, topic)
	if err != nil {
		panic(err)
	}
	var key, body string
	_, err = pgx.ForEachRow(rows, []any{&key, &body}, func() error {
		fmt.Println("outbox row:", key, body)
		return nil
	})
	if err != nil {
		panic(err)
	}

	// Output:
	// transaction: card declined
	// outbox row: payment-1 {"status":"declined"}
}

// ExampleRelay_Run runs a relay the way a service does, beside the code that
// writes events, and reads what it published back from Kafka: one key's
// events arrive in the order they were written.
func ExampleRelay_Run() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0                      // your brokers' protocol version; Kafka 4 takes 2.1 and later
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest // a new consumer group reads the topic from its start
	// The partition key (outbox.NewMessage's first argument) becomes the
	// Kafka record key, so one key's messages share a partition.
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)

	// A topic of its own, so the example can run again on the same broker.
	topic := "example.shipments." + watermill.NewShortUUID()

	// Three events of one shipment, each in a transaction of its own, as the
	// shipment moves on; they are published once their transactions commit.
	for _, status := range []string{"packed", "shipped", "delivered"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// ... the shipment's own row is updated here, in tx ...
			return outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("shipment-7", []byte(status)))
		})
		if err != nil {
			panic(err)
		}
	}

	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: conf, Marshaler: marshaler})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		panic(err)
	}
	// Run publishes until its context ends, then finishes the batch in
	// flight and returns.
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()

	// On the other side, a consumer of the topic.
	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           marshaler,
		OverwriteSaramaConfig: conf,
		ConsumerGroup:         "example-shipment-tracker",
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	defer subscriber.Close()
	received, err := subscriber.Subscribe(ctx, topic)
	if err != nil {
		panic(err)
	}
	for range 3 {
		select {
		case msg := <-received:
			fmt.Printf("%s %s\n", msg.Metadata.Get(outbox.KeyMetadata), msg.Payload)
			msg.Ack()
		case <-ctx.Done():
			panic(ctx.Err())
		}
	}

	stopRelay()
	if err := <-relayDone; err != nil {
		panic(err)
	}
	// Run returned after marking what it had published.
	var unpublished int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND published_at IS NULL`, topic).Scan(&unpublished); err != nil {
		panic(err)
	}
	fmt.Println("unpublished:", unpublished)

	// Output:
	// shipment-7 packed
	// shipment-7 shipped
	// shipment-7 delivered
	// unpublished: 0
}
