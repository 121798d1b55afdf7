// Command killed-after-commit is the pattern in one program: an orders
// service pays an order and writes its OrderPaid to the outbox in the same
// transaction; the relay publishes it to Kafka; an inventory service
// reserves stock for it through the inbox, which records the message in the
// transaction of the reservation. With -kill, the service is SIGKILLed after
// that transaction committed and before Kafka heard the offset: started
// again, it is handed the same record, and the inbox suppresses the copy.
//
//	go run ./examples/killed-after-commit -kill
//
// It needs nothing set up: Postgres and a Kafka broker are started embedded
// (pkg/pgtest, pkg/kafkatest) unless DATABASE_URL and KAFKA_BROKERS name
// yours. The services run as a child process of this one, which keeps the
// database and the broker alive across the kill.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/kafkatest"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

func main() {
	kill := flag.Bool("kill", false, "SIGKILL the services between the inbox's commit and the offset's, then start them again")
	child := flag.Bool("services", false, "run the services (the parent process starts them so)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := machine
	if *child {
		run = services
	}
	if err := run(ctx, *kill); err != nil {
		fmt.Fprintln(os.Stderr, "killed-after-commit:", err)
		os.Exit(1)
	}
}

// machine starts the database and the broker, runs the services as a child
// process until the order is answered (again after a kill), and shows what
// the database holds.
func machine(ctx context.Context, kill bool) error {
	pg, err := pgtest.Start(ctx) // DATABASE_URL, or an embedded Postgres
	if err != nil {
		return err
	}
	defer pg.Stop() //nolint:errcheck // a throwaway cluster
	// KAFKA_BROKERS, or an embedded broker
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
	if err := inbox.Migrate(ctx, pool); err != nil { // the inbox's tables, and the outbox's
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
		CREATE TABLE stock (sku text PRIMARY KEY, reserved int NOT NULL); INSERT INTO stock VALUES ('book', 0)`); err != nil {
		return err
	}

	env := append(os.Environ(), "DATABASE_URL="+url, "KAFKA_BROKERS="+strings.Join(broker.Brokers(), ","),
		"EXAMPLE_TOPIC=example.orders."+watermill.NewShortUUID())
	for start := 1; ; start++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-services", fmt.Sprintf("-kill=%v", kill && start == 1))
		cmd.Env, cmd.Stdout, cmd.Stderr = env, os.Stdout, os.Stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL && start == 1 {
			fmt.Println("machine: the services died (SIGKILL); starting them again")
			continue
		}
		if err != nil {
			return err
		}
		break
	}

	fmt.Println("\nThe three rows, in the services' database:")
	var status, published string
	var reserved, duplicates int
	var inboxStatus string
	err = pool.QueryRow(ctx, `SELECT o.status, to_char(m.published_at, 'HH24:MI:SS'), i.status, i.duplicates, s.reserved
		FROM orders o, outbox_messages m, inbox_messages i, stock s
		WHERE o.id = 'order-1' AND m.partition_key = 'order-1' AND i.message_id = m.message_id::text AND s.sku = 'book'`).
		Scan(&status, &published, &inboxStatus, &duplicates, &reserved)
	if err != nil {
		return err
	}
	fmt.Printf("  domain  orders:          order-1 %s\n", status)
	fmt.Printf("  outbox  outbox_messages: OrderPaid order-1, published at %s\n", published)
	fmt.Printf("  inbox   inbox_messages:  inventory %s, copies suppressed: %d\n", inboxStatus, duplicates)
	fmt.Printf("  and the effect once:     stock of book reserved %d\n", reserved)
	return nil
}

// services runs orders (paying order-1, once) and inventory (reserving
// stock for each OrderPaid) until inventory settled the order's message.
func services(ctx context.Context, kill bool) error {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	brokers, topic := strings.Split(os.Getenv("KAFKA_BROKERS"), ","), os.Getenv("EXAMPLE_TOPIC")
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_8_0_0
	conf.Consumer.Offsets.Initial = sarama.OffsetOldest
	conf.Consumer.Group.Session.Timeout = 6 * time.Second // Kafka's least: a killed member is gone from the group after it
	marshaler := kafka.NewWithPartitioningMarshaler(outbox.PartitionKey)

	// orders: the relay publishes what committed to the outbox.
	publisher, err := outboxkafka.New(outboxkafka.Config{Brokers: brokers, Sarama: conf, Marshaler: marshaler})
	if err != nil {
		return err
	}
	defer publisher.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher})
	if err != nil {
		return err
	}

	// inventory: the inbox around the handler, which writes through the
	// inbox's transaction.
	settled, done := make(chan inbox.Outcome, 4), make(chan struct{})
	in, err := inbox.New(inbox.Config{Pool: pool, Consumer: "inventory", OnOutcome: func(e inbox.Event) {
		if e.Outcome != inbox.Retried { // a failed attempt is told too; the delivery settles later
			settled <- e.Outcome
		}
	}})
	if err != nil {
		return err
	}
	reserve := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		_, err := inbox.Tx(msg.Context()).Exec(msg.Context(), `UPDATE stock SET reserved = reserved + 1 WHERE sku = 'book'`)
		return nil, err
	})
	subscriber, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: marshaler, OverwriteSaramaConfig: conf, ConsumerGroup: "inventory",
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddConsumerHandler("reserve", topic, subscriber, func(msg *message.Message) error {
		if _, err := reserve(msg); err != nil {
			return err // nothing committed: the record comes again
		}
		fmt.Printf("inventory: OrderPaid %s: %s\n", msg.Metadata.Get(outbox.KeyMetadata), said[<-settled])
		if kill {
			// The inbox's transaction committed; the router has not acked
			// the record, so Kafka's committed offset is still before it.
			fmt.Println("inventory: committed, not acked: SIGKILL")
			return syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		close(done)
		return nil // acked: watermill-kafka marks the offset
	})

	runCtx, stop := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return relay.Run(gctx) })
	g.Go(func() error { return in.Run(gctx) })
	g.Go(func() error { return router.Run(gctx) })
	<-router.Running()

	// orders: paying order-1 is one transaction, the order's row and its
	// event; paid already (a second start), nothing is written.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('order-1', 'paid') ON CONFLICT DO NOTHING`)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		fmt.Println("orders: order-1 paid; OrderPaid written to the outbox in the same transaction")
		return outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("order-1", []byte(`{"order":"order-1","sku":"book"}`)))
	})
	if err != nil {
		stop()
		return errors.Join(err, g.Wait())
	}
	select { // the order's message settled and acked; stopping commits the offset
	case <-done:
	case <-ctx.Done():
	}
	stop()
	return errors.Join(g.Wait(), ctx.Err())
}

// said is what the inventory service says of an outcome.
var said = map[inbox.Outcome]string{
	inbox.Applied:   "applied (stock reserved and the inbox row written, in one transaction)",
	inbox.Duplicate: "duplicate (the inbox row is there: the handler did not run)",
}
