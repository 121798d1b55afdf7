// Command kafka-init prepares docker-compose.yml's Kafka for the example
// system, as a one-shot job after the broker is healthy: the topics, then
// a principal per client (orders, inventory, demo, dashboard) with its
// password from .env and only the ACLs it needs (services/runtime/kafkainit). It
// logs in as the broker's superuser (KAFKA_SASL_*). Exits 0 when all is in
// place; running it again changes nothing.
//
//	kafka-init [-topics a,b] [-partitions 6] [-replication-factor 1] [-timeout 2m]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outbox-inbox/services/runtime/kafkainit"
)

func main() {
	plan, err := kafkainit.Parse(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafka-init:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := kafkainit.Run(ctx, plan, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-init:", err)
		os.Exit(1)
	}
	fmt.Println("kafka-init: done")
}
