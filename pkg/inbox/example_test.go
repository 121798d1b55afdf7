package inbox_test

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// The broker delivers a payment twice, as it does when the consumer dies
// after its commit and before the Kafka offset is committed. The account is
// credited once.
func ExampleInbox_Middleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDatabaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// The inbox tables, and the outbox that dead letters are published through.
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE account (balance int NOT NULL); INSERT INTO account VALUES (0)`); err != nil {
		panic(err)
	}

	in, err := inbox.New(inbox.Config{
		Pool:      pool,
		Consumer:  "billing",
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
		_, err = tx.Exec(msg.Context(), `UPDATE account SET balance = balance + $1`, amount)
		return nil, err
	})

	for range 2 {
		msg := message.NewMessage("0191a3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b", []byte("100"))
		if _, err := credit(msg); err != nil {
			panic(err)
		}
	}

	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM account`).Scan(&balance); err != nil {
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

// A set-based handler: the payments that arrive together are credited by one
// statement in one transaction, and a payment delivered twice still counts
// once. (Delivered one after another here, each batch holds one message; a
// router with many partitions hands the inbox many at once.)
func ExampleInbox_Handler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleDatabaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE account (balance int NOT NULL); INSERT INTO account VALUES (0)`); err != nil {
		panic(err)
	}

	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "billing", BatchSize: 64})
	if err != nil {
		panic(err)
	}
	// In a service: router.AddConsumerHandler("credit", topic, subscriber, credit).
	credit := in.Handler(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
		amounts := make([]int32, len(msgs))
		for i, msg := range msgs {
			n, err := strconv.Atoi(string(msg.Payload))
			if err != nil {
				return inbox.Permanent(fmt.Errorf("message %s: reading amount: %w", msg.UUID, err))
			}
			amounts[i] = int32(n)
		}
		_, err := tx.Exec(ctx, `UPDATE account SET balance = balance + (SELECT sum(a) FROM unnest($1::int[]) AS a)`, amounts)
		return err
	})

	for _, id := range []string{"0191a3c4-0000-7000-8000-000000000001", "0191a3c4-0000-7000-8000-000000000002", "0191a3c4-0000-7000-8000-000000000001"} {
		if err := credit(message.NewMessage(id, []byte("100"))); err != nil {
			panic(err)
		}
	}

	var balance int
	if err := pool.QueryRow(ctx, `SELECT balance FROM account`).Scan(&balance); err != nil {
		panic(err)
	}
	fmt.Println("balance:", balance)
	fmt.Println("duplicates:", in.Stats().Duplicates)
	// Output:
	// balance: 200
	// duplicates: 1
}
