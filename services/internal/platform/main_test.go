package platform

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

// The servers every test shares, the defaults LoadConfig gives, and every
// span any service of this process ended (each test looks only at its own
// traces).
var (
	pg       *pgtest.Server
	kfk      *stack.Kafka
	defaults Config
	spans    = tracetest.NewInMemoryExporter()
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if pg, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "platform tests:", err)
		return 1
	}
	defer pg.Stop() //nolint:errcheck
	if kfk, err = stack.StartKafka(ctx, stack.KafkaOptions{Partitions: 3}); err != nil {
		fmt.Fprintln(os.Stderr, "platform tests:", err)
		return 1
	}
	defer kfk.Close()

	// The defaults of every variable, as a service would read them; each
	// service of a test then gets its own database and address.
	os.Setenv("DATABASE_URL", "set-per-service") //nolint:errcheck
	os.Setenv("KAFKA_BROKERS", strings.Join(kfk.Brokers(), ","))
	defaults, err = LoadConfig(":0")
	os.Unsetenv("DATABASE_URL") //nolint:errcheck
	os.Unsetenv("KAFKA_BROKERS")
	if err != nil {
		fmt.Fprintln(os.Stderr, "platform tests:", err)
		return 1
	}
	defaults.LogLevel = "warn"
	defaults.Tracing = "off" // the test installs its own provider below; Run must leave it alone
	defaults.KafkaCommitInterval = 100 * time.Millisecond
	defaults.InboxRetryBackoff = 10 * time.Millisecond

	// What setupTracing installs with TRACING=otlp, with a synchronous
	// in-memory exporter instead of OTLP.
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return m.Run()
}

var seq atomic.Int64

// pair is a producer and a consumer service, started in this process by
// Run with the real platform wiring (pool, migrations, relay, router, inbox,
// HTTP), shaped like orders and inventory: POST /pay/{id} marks an order paid
// and writes OrderPaid to the outbox; inventory consumes it, records a
// reservation and answers through its outbox; orders consumes the answer.
type pair struct {
	ctx                       context.Context
	orders, inventory         string // service (consumer) names
	ordersTopic, invTopic     string
	ordersAddr, invAddr       string
	ordersPool, inventoryPool *pgxpool.Pool
}

func setup(t *testing.T) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	n := seq.Add(1)
	suffix := fmt.Sprintf("%d-%s", n, watermill.NewShortUUID()[:6])
	p := &pair{
		ctx:    ctx,
		orders: "orders-" + suffix, inventory: "inventory-" + suffix,
		ordersTopic: "orders.events-" + suffix, invTopic: "inventory.events-" + suffix,
	}
	require.NoError(t, kfk.CreateTopics(ctx, 3, p.ordersTopic, p.invTopic))

	ordersSvc := Service{
		Name:  p.orders,
		Topic: p.invTopic,
		Migrations: fstest.MapFS{"001_orders.sql": {Data: []byte(
			`CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`)}},
		Routes: func(mux *http.ServeMux, db DB, _ Config) {
			mux.HandleFunc("POST /pay/{id}", func(w http.ResponseWriter, r *http.Request) {
				id := r.PathValue("id")
				err := db.Write(r.Context(), func(tx pgx.Tx) error {
					if _, err := tx.Exec(r.Context(), `INSERT INTO orders (id, status) VALUES ($1, 'paid')`, id); err != nil {
						return err
					}
					return outbox.PublishTx(r.Context(), tx, p.ordersTopic, outbox.NewMessage(id, []byte(id)))
				})
				if err != nil {
					WriteError(w, http.StatusInternalServerError, err.Error())
					return
				}
				WriteJSON(w, http.StatusOK, map[string]string{"id": id, "status": "paid"})
			})
		},
		Apply: always(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			for _, msg := range msgs {
				if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'reserved' WHERE id = $1`, string(msg.Payload)); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	inventorySvc := Service{
		Name:  p.inventory,
		Topic: p.ordersTopic,
		Migrations: fstest.MapFS{"001_inventory.sql": {Data: []byte(
			`CREATE TABLE reservations (order_id text NOT NULL, message_id text NOT NULL)`)}},
		Routes: func(*http.ServeMux, DB, Config) {},
		Apply: always(func(ctx context.Context, tx pgx.Tx, msgs []*message.Message) error {
			for _, msg := range msgs {
				id := string(msg.Payload)
				if _, err := tx.Exec(ctx, `INSERT INTO reservations VALUES ($1, $2)`, id, msg.UUID); err != nil {
					return err
				}
				if err := outbox.PublishTx(ctx, tx, p.invTopic, outbox.NewMessage(id, []byte(id))); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	p.ordersAddr, p.ordersPool = start(t, ctx, ordersSvc)
	p.invAddr, p.inventoryPool = start(t, ctx, inventorySvc)
	return p
}

// start runs svc on a database of its own until the test ends, and waits
// until it is ready. It returns its address and a pool on its database.
func start(t *testing.T, ctx context.Context, svc Service) (string, *pgxpool.Pool) {
	t.Helper()
	url, err := pg.CreateDatabase(ctx, strings.NewReplacer("-", "_", ".", "_").Replace("platform_"+svc.Name))
	require.NoError(t, err)
	addr, err := procs.FreeAddr()
	require.NoError(t, err)
	cfg := defaults
	cfg.DatabaseURL, cfg.HTTPAddr, cfg.Instance = url, addr, svc.Name

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, svc) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done, "%s stopped with an error", svc.Name)
	})
	eventually(t, ctx, func() bool {
		select {
		case err := <-done:
			t.Fatalf("%s stopped: %v", svc.Name, err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, svc.Name+" to be ready")

	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return addr, pool
}

// pay pays order id through the orders HTTP API.
func (p *pair) pay(t *testing.T, id string) {
	t.Helper()
	resp, err := http.Post("http://"+p.ordersAddr+"/pay/"+id, "application/json", nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
}

func (p *pair) status(t *testing.T, id string) string {
	t.Helper()
	var s string
	require.NoError(t, p.ordersPool.QueryRow(p.ctx, `SELECT status FROM orders WHERE id = $1`, id).Scan(&s))
	return s
}

// duplicates sums what the inventory inbox suppressed.
func (p *pair) duplicates(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, p.inventoryPool.QueryRow(p.ctx, `SELECT coalesce(sum(duplicates), 0) FROM inbox_messages`).Scan(&n))
	return n
}

// republishOrderPaid makes the orders relay publish id's OrderPaid again, as
// a relay killed after publishing and before marking the row does.
func (p *pair) republishOrderPaid(t *testing.T, id string) {
	t.Helper()
	tag, err := p.ordersPool.Exec(p.ctx, `UPDATE outbox_messages SET published_at = NULL WHERE partition_key = $1`, id)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	_, err = p.ordersPool.Exec(p.ctx, `SELECT pg_notify($1, '')`, outbox.NotifyChannel("public"))
	require.NoError(t, err)
}

// scrape returns the service's GET /metrics text.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// metric returns the value of the sample named series (name and labels as
// the text format prints them, e.g. `x_total{a="b"}`), or -1 when missing.
func metric(t *testing.T, text, series string) float64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if ok && name == series {
			v, err := strconv.ParseFloat(value, 64)
			require.NoError(t, err, sc.Text())
			return v
		}
	}
	return -1
}

// eventually polls cond every 20ms until it holds, and fails the test when
// ctx ends first.
func eventually(t *testing.T, ctx context.Context, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// always makes a Service.Apply that ignores the configuration.
func always(fn inbox.BatchFunc) func(Config) inbox.BatchFunc {
	return func(Config) inbox.BatchFunc { return fn }
}
