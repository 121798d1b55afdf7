package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// Example writes an order and its OrderPlaced event in one transaction, then
// runs one relay batch, which publishes the event to Kafka and marks its row.
func Example() {
	ctx := context.Background()

	// exampleDatabase returns a pool on a fresh database of the Postgres
	// that TestMain started (or DATABASE_URL).
	pool := exampleDatabase(ctx)
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL)`); err != nil {
		panic(err)
	}

	// The order and its event commit together, or not at all.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, total_cents) VALUES (42, 1999)`); err != nil {
			return err
		}
		event := outbox.NewMessage("order-42", []byte(`{"order_id":42,"total_cents":1999}`))
		return outbox.PublishTx(ctx, tx, exampleTopic("orders"), event)
	})
	if err != nil {
		panic(err)
	}

	publisher, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               testKafka.Brokers(),
		Marshaler:             kafka.NewWithPartitioningMarshaler(outbox.PartitionKey),
		OverwriteSaramaConfig: kafkatest.Sarama(),
	}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	defer publisher.Close()

	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		panic(err)
	}
	// A service runs relay.Run(ctx); one batch is enough here.
	n, err := relay.RelayOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("published:", n)

	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE published_at IS NULL`).Scan(&pending); err != nil {
		panic(err)
	}
	fmt.Println("pending:", pending)

	// Output:
	// published: 1
	// pending: 0
}

// ExamplePublishTx shows that an event written in a transaction that rolls
// back is never stored, so it can never be published.
func ExamplePublishTx() {
	ctx := context.Background()
	pool := exampleDatabase(ctx)
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	topic := exampleTopic("payments")

	errDeclined := errors.New("card declined")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
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

	rows, err := pool.Query(ctx, `SELECT partition_key, convert_from(payload, 'UTF8') FROM outbox_messages ORDER BY id`)
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

var exampleSeq atomic.Int64

// exampleDatabase creates a fresh database on the test Postgres and returns a
// pool on it. Examples run once per -count, so the name must be new each time.
// The database is dropped when the package's tests stop.
func exampleDatabase(ctx context.Context) *pgxpool.Pool {
	name := fmt.Sprintf("outbox_example_%d_%s", exampleSeq.Add(1), randomSuffix())
	url, err := testPG.CreateDatabase(ctx, name)
	if err != nil {
		panic(err)
	}
	testPG.DropAtStop(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	return pool
}

// exampleTopic returns a topic name that is new on every run of an example.
func exampleTopic(name string) string {
	return fmt.Sprintf("example_%s_%d_%s", name, exampleSeq.Add(1), randomSuffix())
}
