package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxkafka"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// TestRecordsTheBrokerDeletedAreRecorded: inventory is paused (SIGSTOP)
// while orders are paid and their OrderPaid published, and every record of
// orders.events (their OrderPaid and OrderCaptured) is then deleted under
// its committed offsets (Kafka's DeleteRecords). Resumed, inventory records exactly the records it never
// read, per partition, in its database, counts them in its metrics, and
// keeps running: the deleted records are no stall. The orders behind them
// stay unanswered until orders republishes the window by hand
// (outboxadmin.Admin.Republish): then every order ends, each applied once.
func TestRecordsTheBrokerDeletedAreRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, system.Options{Env: []string{"KAFKA_STALL_TIMEOUT=6s", "KAFKA_COMMIT_INTERVAL=200ms"}, AuditGrace: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// quiet waits until orders has made every call of its payments and sent
	// every event they publish: nothing more comes on orders.events.
	quiet := func() {
		t.Helper()
		for {
			var pending, unsent int
			require.NoError(t, b.sys.Pools["orders"].QueryRow(ctx, `SELECT (SELECT count(*) FROM effects WHERE state = 'pending'),
				(SELECT count(*) FROM outbox_messages WHERE topic = $1 AND published_at IS NULL)`, events.TopicOrders).Scan(&pending, &unsent))
			if pending+unsent == 0 {
				return
			}
			require.NoError(t, ctx.Err(), "orders never sent what its payments publish")
			time.Sleep(100 * time.Millisecond) // polling a condition
		}
	}
	warm, err := loadgen.Run(ctx, b.sys.Client, b.skus, loadgen.Plan{Orders: 20, Concurrency: 4, Seed: 1})
	require.NoError(t, err)
	require.Len(t, warm.Paid, 20)
	quiet()
	// What is sent again comes from the outbox: each service found that its
	// relay keeps published rows as long as Kafka keeps their records (its
	// principal may read its own topics' settings).
	for _, p := range b.sys.All() {
		for {
			log, err := os.ReadFile(filepath.Join(b.sys.Work, p.Name+".log"))
			require.NoError(t, err)
			if bytes.Contains(log, []byte(`msg="relay retention covers Kafka's"`)) {
				break
			}
			require.NoError(t, ctx.Err(), "%s never checked its relay's retention against Kafka's", p.Name)
			time.Sleep(100 * time.Millisecond) // polling a condition
		}
	}
	client, err := sarama.NewClient(b.sys.Kafka.Brokers(), kafkaconf.SaramaAs(b.sys.Kafka.Admin()))
	require.NoError(t, err)
	defer client.Close()
	lags := func() []inboxkafka.PartitionLag {
		t.Helper()
		l, err := inboxkafka.ReadGroupLag(client, "inventory", events.TopicOrders)
		require.NoError(t, err)
		return l
	}
	for caughtUp := false; !caughtUp; {
		require.NoError(t, ctx.Err(), "inventory never committed what it read")
		caughtUp = true
		for _, l := range lags() {
			caughtUp = caughtUp && l.Lag() == 0
		}
		time.Sleep(100 * time.Millisecond) // polling a condition
	}

	inv := b.sys.Procs["inventory"][0]
	require.Len(t, b.sys.Procs["inventory"], 1)
	require.NoError(t, inv.Signal(syscall.SIGSTOP))
	paused := time.Now()
	res, err := loadgen.Run(ctx, b.sys.Client, b.skus, loadgen.Plan{Orders: 30, Concurrency: 4, Seed: 2})
	require.NoError(t, err)
	require.Len(t, res.Paid, 30)
	quiet()
	want := map[int32][2]int64{} // partition → the range deleted under the committed offset
	ends := map[int32]int64{}
	var lost int64
	for _, l := range lags() {
		from := l.Committed
		if from < 0 {
			from = l.Start // nothing committed: inventory's claim began at the log start
		}
		if l.End > from {
			want[l.Partition] = [2]int64{from, l.End}
			lost += l.End - from
		}
		ends[l.Partition] = l.End
	}
	require.GreaterOrEqual(t, lost, int64(30), "every OrderPaid (and OrderCaptured) waits past inventory's committed offsets")
	admin, err := sarama.NewClusterAdminFromClient(client)
	require.NoError(t, err)
	require.NoError(t, admin.DeleteRecords(events.TopicOrders, ends))
	starts := time.Now()
	require.NoError(t, inv.Signal(syscall.SIGCONT))

	// Each partition's range runs from the first record inventory never
	// read to the log start. It starts at the committed offset (the log
	// start where inventory committed nothing), or past the few records a
	// fetch sent before the pause had already brought in (delivered and
	// applied after it, though the broker deleted them): no record inside
	// it has an inbox row.
	got := map[int32][2]int64{}
	for len(got) < len(want) {
		require.NoError(t, ctx.Err(), "inventory recorded %v of the ranges %v", got, want)
		rows, err := b.sys.Pools["inventory"].Query(ctx, `SELECT kafka_partition, from_offset, to_offset FROM inbox_skipped_ranges
			WHERE consumer = 'inventory' AND topic = $1 AND cause = 'deleted'`, events.TopicOrders)
		require.NoError(t, err)
		clear(got)
		for rows.Next() {
			var p int32
			var from, to int64
			require.NoError(t, rows.Scan(&p, &from, &to))
			require.NotContains(t, got, p, "two ranges of partition %d", p)
			got[p] = [2]int64{from, to}
		}
		require.NoError(t, rows.Err())
		time.Sleep(200 * time.Millisecond) // polling a condition
	}
	var read, recorded int64
	for p, w := range want {
		g := got[p]
		require.Equal(t, w[1], g[1], "partition %d: the range ends at the log start", p)
		require.GreaterOrEqual(t, g[0], w[0], "partition %d: the range starts at or past the committed offset", p)
		var inRange int64
		require.NoError(t, b.sys.Pools["inventory"].QueryRow(ctx, `SELECT count(*) FROM inbox_messages WHERE consumer = 'inventory'
			AND topic = $1 AND kafka_partition = $2 AND kafka_offset >= $3 AND kafka_offset < $4`, events.TopicOrders, p, g[0], g[1]).Scan(&inRange))
		require.Zero(t, inRange, "partition %d: a record of the range %v was read", p, g)
		read += g[0] - w[0]
		recorded += g[1] - g[0]
	}

	// Past twice the stall timeout, inventory still runs the process it
	// resumed (deleted records are no stall), and its metrics count them.
	time.Sleep(max(0, 12*time.Second-time.Since(starts))) // the stall timeout's window: no signal tells that nothing happened
	require.Equal(t, 1, inv.Starts(), "inventory was started again")
	select {
	case <-inv.Exited():
		t.Fatalf("inventory exited: %v", inv.ExitStatus())
	default:
	}
	resp, err := http.Get("http://" + inv.Addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^inbox_skipped_records_total\{consumer="inventory"\} (\d+)$`).FindSubmatch(body)
	require.NotNil(t, m, "no inbox_skipped_records_total in inventory's metrics")
	require.Equal(t, strconv.FormatInt(recorded, 10), string(m[1]))
	require.Regexp(t, `(?m)^inbox_skipped_ranges_unrepaired\{consumer="inventory"\} `+strconv.Itoa(len(want))+`$`, string(body))

	// Not repaired yet: the orders whose OrderPaid was deleted are unanswered.
	ids := make([]string, len(res.Paid))
	for i, o := range res.Paid {
		ids[i] = o.ID
	}
	rows, err := b.sys.Pools["orders"].Query(ctx, `SELECT status || coalesce(' (' || reject_reason || ')', ''), count(*) FROM orders WHERE id = ANY($1::uuid[]) GROUP BY 1`, ids)
	require.NoError(t, err)
	statuses, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) { // every one still paid, but what inventory read
		var s string
		var n int
		err := r.Scan(&s, &n)
		return fmt.Sprintf("%s %d", s, n), err
	})
	require.NoError(t, err)
	if read == 0 {
		require.Equal(t, []string{"paid 30"}, statuses)
	}

	// The repair, by hand: orders sends what it published since the pause
	// again. Every order ends, each applied once, and the copies inventory
	// had read are duplicates.
	n, err := outboxadmin.New(b.sys.Pools["orders"]).Republish(ctx, outboxadmin.RepublishFilter{
		Topic: events.TopicOrders, Since: paused, Until: time.Now()}, "e2e", "inventory's skipped ranges")
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, lost-read)
	paid := res.Client()
	paid.Paid = append(paid.Paid, warm.Client().Paid...)
	report, err := judge.Wait(ctx, b.sys.Pools["orders"], b.sys.Pools["inventory"], b.stock, paid, judge.Settled(50),
		func(r judge.Report) { t.Logf("waiting: %d of %d settled", r.Reserved+r.Rejected, r.OrdersPaid) })
	require.NoError(t, err, "invariants: %+v", report.Invariants)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	require.Equal(t, 50, report.Reserved+report.Rejected)
}
