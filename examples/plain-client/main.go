// Command plain-client feeds the inbox from a Kafka client of its own
// (franz-go), without Watermill's router: inbox.Deliver applies one record
// through the handler in the inbox's transaction and returns once it is
// settled; the client commits the record's offset after that, and only
// then. The record comes twice, as Kafka may deliver it; the second is
// suppressed.
//
//	go run ./examples/plain-client
//
// Postgres and a broker are started embedded unless DATABASE_URL and
// KAFKA_BROKERS name yours.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "plain-client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck // a throwaway cluster
	broker, err := kafkatest.Start(ctx, kafkatest.Options{Partitions: 1})
	if err != nil {
		return err
	}
	defer broker.Close()
	name := fmt.Sprintf("example_%d", os.Getpid())
	url, err := pg.CreateDatabase(ctx, name)
	if err != nil {
		return err
	}
	pg.DropAtStop(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL); INSERT INTO stock VALUES ('book', 0)`); err != nil {
		return err
	}

	topic := "example.orders." + watermill.NewShortUUID()
	client, err := kgo.NewClient(kgo.SeedBrokers(broker.Brokers()...), kgo.AllowAutoTopicCreation(),
		kgo.ConsumerGroup("inventory"), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit())
	if err != nil {
		return err
	}
	defer client.Close()
	// One OrderPaid, written twice under one id: a producer that sent it
	// again after a lost ack, a relay that published its batch twice.
	paid := &kgo.Record{Topic: topic, Key: []byte("order-1"), Value: []byte(`{"order":"order-1","sku":"book"}`),
		Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(watermill.NewUUID())}}}
	for range 2 {
		if err := client.ProduceSync(ctx, paid).FirstErr(); err != nil {
			return err
		}
	}

	settled := make(chan inbox.Outcome, 4)
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "inventory", MessageID: inbox.FromMetadata("message_id"),
		OnOutcome: func(e inbox.Event) {
			if e.Outcome != inbox.Retried { // a failed attempt is told too; the delivery settles later
				settled <- e.Outcome
			}
		}})
	if err != nil {
		return err
	}
	reserve := func(msg *message.Message) ([]*message.Message, error) {
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `UPDATE stock SET reserved = reserved + 1 WHERE sku = 'book'`)
		return nil, err
	}
	for seen := 0; seen < 2; {
		fetches := client.PollFetches(ctx)
		if err := fetches.Err(); err != nil {
			return err
		}
		for _, r := range fetches.Records() {
			msg := message.NewMessage("", r.Value)
			for _, h := range r.Headers {
				msg.Metadata.Set(h.Key, string(h.Value))
			}
			if err := in.Deliver(ctx, r.Topic, msg, reserve); err != nil {
				return err // not settled: the offset stays, and the record comes again
			}
			if err := client.CommitRecords(ctx, r); err != nil { // settled: now the offset
				return err
			}
			var reserved int
			if err := pool.QueryRow(ctx, `SELECT reserved FROM stock WHERE sku = 'book'`).Scan(&reserved); err != nil {
				return err
			}
			fmt.Printf("offset %d: %s, offset committed; stock reserved: %d\n", r.Offset, <-settled, reserved)
			seen++
		}
	}
	return nil
}
