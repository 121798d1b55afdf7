package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/system"
)

// TestExternalMode runs the demo's external mode (what the compose `demo`
// container runs) against a system started here, twice on the same
// databases, as `docker compose run demo` again would.
func TestExternalMode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole system")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sys, err := system.Start(ctx, system.Options{Work: t.TempDir(), Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Stop()
	ext := external{
		ordersURL:    "http://" + sys.Procs["orders"][0].Addr,
		inventoryURL: "http://" + sys.Procs["inventory"][0].Addr,
		ordersDB:     sys.DBURL["orders"],
		inventoryDB:  sys.DBURL["inventory"],
		brokers:      sys.Kafka.Brokers(),
		sign:         sys.SignAsProducer,
	}
	flowLine := regexp.MustCompile(`(?m)^order …[0-9a-f]{8} paid → OrderPaid …[0-9a-f]{8} published → inventory reserved 3 × sku-07 → duplicate delivery of …[0-9a-f]{8} suppressed → order …[0-9a-f]{8} reserved$`)
	for run := 1; run <= 2; run++ {
		out, err := captureStdout(func() error {
			return runExternal(ctx, options{orders: 40, concurrency: 4, deadline: time.Minute, seed: uint64(run)}, ext)
		})
		t.Logf("run %d:\n%s", run, out)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		for _, want := range []*regexp.Regexp{
			flowLine,
			regexp.MustCompile(`(?m)^order …[0-9a-f]{8} paid twice at once → OrderPaid …[0-9a-f]{8} published → inventory reserved 1 × sku-02, 2 × sku-05 → order …[0-9a-f]{8} reserved$`),
			regexp.MustCompile(`(?m)^order …[0-9a-f]{8} paid → OrderPaid …[0-9a-f]{8} published → inventory rejected it \(insufficient stock: sku-19: want \d+, have \d+\) → order …[0-9a-f]{8} rejected$`),
			regexp.MustCompile(`(?m)^every paid order ended reserved or rejected: 43 paid in this run`),
			regexp.MustCompile(`(?m)^PASS$`),
		} {
			if !want.MatchString(out) {
				t.Errorf("run %d: no line matching %s", run, want)
			}
		}
		if run == 2 && !strings.Contains(out, "already holds 43 paid orders") {
			t.Errorf("run 2 did not see run 1's orders")
		}
	}
}

func TestExternalFromEnv(t *testing.T) {
	for _, name := range externalEnv {
		t.Setenv(name, "")
	}
	if _, ok, _ := externalFromEnv(); ok {
		t.Fatal("external mode without ORDERS_URL/INVENTORY_URL")
	}
	t.Setenv("ORDERS_URL", "http://orders:8081/")
	if _, ok, err := externalFromEnv(); !ok || err == nil || !strings.Contains(err.Error(), "INVENTORY_URL, ORDERS_DATABASE_URL, INVENTORY_DATABASE_URL, KAFKA_BROKERS") {
		t.Fatalf("want external mode refusing the missing variables, got ok=%v err=%v", ok, err)
	}
	t.Setenv("INVENTORY_URL", "http://inventory:8082")
	t.Setenv("ORDERS_DATABASE_URL", "postgres://o")
	t.Setenv("INVENTORY_DATABASE_URL", "postgres://i")
	t.Setenv("KAFKA_BROKERS", "kafka:9092, other:9092")
	ext, ok, err := externalFromEnv()
	if !ok || err != nil || ext.ordersURL != "http://orders:8081" || len(ext.brokers) != 2 {
		t.Fatalf("got %+v ok=%v err=%v", ext, ok, err)
	}
}

// captureStdout runs f with os.Stdout sent to a buffer (the demo prints
// with fmt.Printf).
func captureStdout(f func() error) (string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", err
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		var buf bytes.Buffer
		io.Copy(&buf, r) //nolint:errcheck
		done <- buf.String()
	}()
	ferr := f()
	os.Stdout = old
	w.Close()
	return <-done, ferr
}
