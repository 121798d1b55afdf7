package main

import (
	"net"
	"strconv"
	"testing"

	"github.com/IBM/sarama"

	"github.com/outboxref/outbox-inbox/internal/kafkaconf"
	"github.com/outboxref/outbox-inbox/internal/system"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestStandIn: the broker advertises the given address, seeds the topics,
// passes its healthcheck, and -create-topics succeeds on it; the
// healthcheck fails for a topic it lacks and for a broker that is gone.
func TestStandIn(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	addr := "127.0.0.1:" + port
	c, err := start(addr, "localhost:"+port, system.Topics, 6)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	client, err := sarama.NewClient([]string{addr}, kafkaconf.Sarama())
	if err != nil {
		t.Fatal(err)
	}
	if got := client.Brokers()[0].Addr(); got != "localhost:"+port {
		t.Errorf("advertised %s, want localhost:%s", got, port)
	}
	client.Close()

	if err := check(addr, system.Topics, 6); err != nil {
		t.Fatalf("healthcheck: %v", err)
	}
	if err := check(addr, []string{"no.such.topic"}, 6); err == nil {
		t.Error("healthcheck passed for a topic the broker lacks")
	}
	if err := check(addr, system.Topics, 7); err == nil {
		t.Error("healthcheck passed with fewer partitions than wanted")
	}
	t.Setenv("KAFKA_BROKERS", addr)
	if err := createTopics(system.Topics, 6); err != nil {
		t.Fatalf("create-topics on existing topics: %v", err)
	}
	c.Close()
	if err := check(addr, system.Topics, 6); err == nil {
		t.Error("healthcheck passed with the broker gone")
	}
}
