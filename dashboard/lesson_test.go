package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/browser"
	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/dashboard"
	"github.com/outboxref/outbox-inbox/dashboard/crashnow"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// TestFlowFollowAndCrash drives the live demo's page in a real headless
// Chromium: the picture's counts must be what SQL and Kafka's offsets say
// (a replayed copy and a dead letter make the stages differ), following an
// order must show its steps with the partition, offset and trace id the
// databases hold, and "crash it now" must kill inventory in
// after-commit-before-ack, restart it, and show the redelivered copy
// suppressed, which the inbox row and the failpoint log confirm. It saves
// the screenshots README shows (docs/live-*.png, with UPDATE_SCREENSHOT=1).
func TestFlowFollowAndCrash(t *testing.T) {
	t.Parallel()
	chrome := browser.Chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	work := t.TempDir()
	fpLog := filepath.Join(work, "failpoints.log")
	// Tracing on, to a receiver that takes the spans and drops them: the
	// outbox rows then carry a traceparent, the journey's trace id.
	otlp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(otlp.Close)
	opts := system.Options{Work: work, Log: t.Logf,
		Env: []string{"TRACING=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.URL, "INBOX_ON_DEAD_LETTER=hold"}}
	crashnow.Prepare(&opts, fpLog)
	sys, err := system.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(sys.Stop)
	skus := loadgen.SKUs(5)
	stock := loadgen.StockFor(60, skus)
	require.NoError(t, sys.Client.SeedStock(ctx, stock))
	lab := crashnow.New(ctx, sys, fpLog)
	url, err := dashboard.Start(ctx, "127.0.0.1:0", dashboard.Options{
		Orders: sys.Pools["orders"], Inventory: sys.Pools["inventory"], Brokers: sys.Kafka.Brokers(),
		Crash: lab, Interval: 200 * time.Millisecond, TraceURL: "http://tracing.example/trace/{trace_id}",
	})
	require.NoError(t, err)

	tab := browser.Start(t, chrome, 1280, 1500)
	require.NoError(t, chromedp.Do(tab, chromedp.Navigate(url)))
	b := &testBundle{ctx: ctx, sys: sys, browser: tab}

	load, err := loadgen.Run(ctx, sys.Client, skus, loadgen.Plan{Orders: 60, Concurrency: 4, Seed: 2})
	require.NoError(t, err)
	_, err = judge.Wait(ctx, sys.Pools["orders"], sys.Pools["inventory"], stock, load.Client(), judge.Settled(60), nil)
	require.NoError(t, err)
	publishHostile(t, b) // a replayed copy (suppressed) and a malformed message (dead-lettered)
	publishHeld(t, b)    // a poison that holds its key, and a message parked behind it

	// 1. The picture agrees with SQL and Kafka.
	want := func() map[string]string { return pictureFromDB(t, b) }
	got := b.waitPicture(t, want, func(w map[string]string) bool {
		return w["dup-inventory"] == dupText(1) && w["left-inventory"] == "inventory: dead letter 2, 2 keys held, 1 parked" // both poisons have a key
	})
	require.NotEqual(t, got["st-orders-topic"], got["st-orders-outbox"], "the replayed copy is in Kafka, not in the outbox")
	t.Logf("picture: %v", got)

	// 2. Follow the order whose OrderPaid was replayed: click it, or paste it.
	var orderID, msgID, traceparent string
	var partition, offset int64
	require.NoError(t, sys.Pools["orders"].QueryRow(ctx, `SELECT partition_key, message_id::text, metadata->>$2 FROM outbox_messages
		WHERE topic = $1 ORDER BY id LIMIT 1`, events.TopicOrders, outbox.TraceparentMetadata).Scan(&orderID, &msgID, &traceparent))
	require.NoError(t, sys.Pools["inventory"].QueryRow(ctx, `SELECT kafka_partition, kafka_offset FROM inbox_messages
		WHERE consumer = 'inventory' AND message_id = $1`, msgID).Scan(&partition, &offset))
	require.NotEmpty(t, traceparent, "tracing is on: the outbox row carries a traceparent")
	// Pasted in another spelling of the same UUID: the same journey.
	_, err = chromedp.Run(tab, chromedp.Evaluate[any](fmt.Sprintf(`window.followOrder(%q)`, "{"+strings.ToUpper(orderID)+"}")))
	require.NoError(t, err)
	// The order may have been captured and ended by now, or not yet: its
	// OrderCaptured's steps come after the settlement, or not at all.
	journey := b.readSteps(t, "journey-steps", func(s steps) bool { return len(s.Kinds) >= 10 && s.Trace != "" })
	require.Equal(t, []string{"created", "paid", "outbox", "published", "inbox", "duplicate", "decided", "outbox", "published", "inbox", "settled"},
		journey.Kinds[:min(11, len(journey.Kinds))], "the order's steps, in order, with the suppressed replay where inventory caught it")
	if rest := journey.Kinds[11:]; len(rest) > 0 {
		require.Equal(t, "outbox", rest[0], "after the settlement, only the order's end: %v", rest)
		require.Subset(t, []string{"outbox", "published", "inbox", "ended"}, rest)
	}
	require.Contains(t, journey.Wheres[3], fmt.Sprintf("Kafka: orders.events, partition %d, offset %d", partition, offset))
	require.Equal(t, strings.Split(traceparent, "-")[1], strings.TrimPrefix(journey.Trace, " · trace "), "the trace id of the payment's trace")
	b.screenshot(t, "live-page.png")

	// 3. Crash it now: inventory, after its commit and before its ack.
	_, err = chromedp.Run(tab, chromedp.Evaluate[any](`window.testMarker = 'same page'`))
	require.NoError(t, err)
	require.NoError(t, lab.Enable(ctx))
	require.NoError(t, chromedp.Do(tab,
		chromedp.WaitVisible(chromedp.ID("crash-card")),
		chromedp.SetValue(chromedp.ID("crash-window"), "after-commit-before-ack"),
		chromedp.Click(chromedp.ID("crash-now"))))
	lesson := b.readSteps(t, "lesson-steps", func(s steps) bool { return s.Done })
	require.Equal(t, []string{"armed", "paid", "killed", "restarted", "redelivered", "suppressed", "settled"}, lesson.Kinds, lesson.Texts)
	for _, i := range []int{2, 4, 5} {
		require.Contains(t, lesson.Texts[i], "after-commit-before-ack", "step %q names the window", lesson.Kinds[i])
	}
	l := lab.Lesson()
	require.Empty(t, l.Failed)
	// What the page said, confirmed where it happened.
	fp, err := os.ReadFile(fpLog)
	require.NoError(t, err)
	require.Contains(t, string(fp), "failpoint after-commit-before-ack fired: SIGKILL pid", "a real kill")
	require.Contains(t, string(fp), "subject "+l.Message)
	var dups, reserved int
	require.NoError(t, sys.Pools["inventory"].QueryRow(ctx, `SELECT duplicates, (SELECT count(*) FROM reservations WHERE order_id = $2)
		FROM inbox_messages WHERE consumer = 'inventory' AND message_id = $1`, l.Message, l.Order).Scan(&dups, &reserved))
	require.Equal(t, 1, dups, "the redelivered copy was suppressed")
	require.Equal(t, 1, reserved, "and the order reserved once")
	require.Equal(t, 2, sys.Procs["inventory"][0].Starts(), "inventory was restarted once")
	got = b.waitPicture(t, want, func(w map[string]string) bool { return w["dup-inventory"] == dupText(2) })
	t.Logf("after the crash: %v", got)
	journey = b.readSteps(t, "journey-steps", func(s steps) bool { return s.Order == l.Order && len(s.Kinds) >= 10 })
	require.Contains(t, journey.Kinds, "duplicate", "the lesson's order shows its suppressed copy")
	marker, err := chromedp.Run(tab, chromedp.Evaluate[string](`String(window.testMarker || '')`))
	require.NoError(t, err)
	require.Equal(t, "same page", marker, "the page followed the lesson without a reload")
	b.screenshot(t, "crash-it-now.png")

	// 4. A window before the commit: the redelivery is applied, once.
	require.NoError(t, chromedp.Do(tab,
		chromedp.SetValue(chromedp.ID("crash-window"), "before-begin"),
		chromedp.Click(chromedp.ID("crash-now"))))
	lesson = b.readSteps(t, "lesson-steps", func(s steps) bool { return s.Done && len(s.Kinds) > 0 && s.Texts[0] != lesson.Texts[0] })
	require.Equal(t, []string{"armed", "paid", "killed", "restarted", "redelivered", "applied", "settled"}, lesson.Kinds, lesson.Texts)
	l = lab.Lesson()
	require.Empty(t, l.Failed)
	require.NoError(t, sys.Pools["inventory"].QueryRow(ctx, `SELECT duplicates, (SELECT count(*) FROM reservations WHERE order_id = $2)
		FROM inbox_messages WHERE consumer = 'inventory' AND message_id = $1`, l.Message, l.Order).Scan(&dups, &reserved))
	require.Equal(t, 0, dups, "killed before its transaction began: the redelivery is the first application")
	require.Equal(t, 1, reserved)
	require.Equal(t, 3, sys.Procs["inventory"][0].Starts(), "inventory was restarted again")
}

// publishHeld publishes a malformed OrderPaid under a key, which inventory
// dead-letters and, with INBOX_ON_DEAD_LETTER=hold, holds its key by, and a
// second message of that key, which is parked behind it.
func publishHeld(t *testing.T, b *testBundle) {
	t.Helper()
	pub, err := kafkaconf.Publisher(b.sys.Kafka.Brokers(), nil)
	require.NoError(t, err)
	defer pub.Close()
	var msgs []*message.Message
	for _, body := range []string{`{"type": "OrderPaid", "schema_version": 1, "order_id": `, `{"type": "OrderPaid"}`} {
		m := outbox.NewMessage(uuid.NewString(), []byte(body))
		m.Metadata.Set(outbox.KeyMetadata, "held-key")
		b.sys.SignAsProducer(events.TopicOrders, m) // a producer's bug, not a forgery
		msgs = append(msgs, m)
	}
	require.NoError(t, pub.Publish(events.TopicOrders, msgs...))
}

// pictureIDs are the picture's elements the test reads.
var pictureIDs = []string{
	"st-orders-paid", "st-orders-outbox", "st-orders-topic", "st-inventory-inbox", "st-inventory-decided",
	"st-inventory-outbox", "st-inventory-topic", "st-orders-inbox", "st-orders-settled",
	"sub-orders-outbox", "sub-inventory-outbox", "dup-inventory", "dup-orders", "left-inventory", "left-orders",
}

// pictureFromDB is what the picture must show, from the test's own SQL and
// its own Kafka client.
func pictureFromDB(t *testing.T, b *testBundle) map[string]string {
	t.Helper()
	orders, inventory := b.sys.Pools["orders"], b.sys.Pools["inventory"]
	out := map[string]string{}
	var paid, settled, ordersOut, ordersPending, ordersApplied, ordersDups int
	require.NoError(t, orders.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM orders WHERE paid_at IS NOT NULL),
		(SELECT count(*) FROM orders WHERE status IN ('reserved', 'rejected')),
		(SELECT count(*) FROM outbox_messages WHERE topic = 'orders.events'),
		(SELECT count(*) FROM outbox_messages WHERE topic = 'orders.events' AND published_at IS NULL),
		(SELECT count(*) FROM inbox_messages WHERE consumer = 'orders' AND status = 'processed'),
		(SELECT coalesce(sum(duplicates), 0) FROM inbox_messages WHERE consumer = 'orders')`).
		Scan(&paid, &settled, &ordersOut, &ordersPending, &ordersApplied, &ordersDups))
	var decided, invOut, invPending, invApplied, invDups, deadLetters, heldKeys, parked int
	require.NoError(t, inventory.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM decisions),
		(SELECT count(*) FROM outbox_messages WHERE topic = 'inventory.events'),
		(SELECT count(*) FROM outbox_messages WHERE topic = 'inventory.events' AND published_at IS NULL),
		(SELECT count(*) FROM inbox_messages WHERE consumer = 'inventory' AND status = 'processed'),
		(SELECT coalesce(sum(duplicates), 0) FROM inbox_messages WHERE consumer = 'inventory'),
		(SELECT count(*) FROM inbox_quarantine WHERE kind = 'dead_letter' AND resolved_at IS NULL),
		(SELECT count(*) FROM inbox_held_keys WHERE consumer = 'inventory'),
		(SELECT count(*) FROM inbox_messages WHERE consumer = 'inventory' AND status = 'parked')`).
		Scan(&decided, &invOut, &invPending, &invApplied, &invDups, &deadLetters, &heldKeys, &parked))
	for id, n := range map[string]int{"st-orders-paid": paid, "st-orders-outbox": ordersOut, "st-inventory-inbox": invApplied,
		"st-inventory-decided": decided, "st-inventory-outbox": invOut, "st-orders-inbox": ordersApplied, "st-orders-settled": settled} {
		out[id] = fmt.Sprint(n)
	}
	out["sub-orders-outbox"] = fmt.Sprintf("%d pending · %d published", ordersPending, ordersOut-ordersPending)
	out["sub-inventory-outbox"] = fmt.Sprintf("%d pending · %d published", invPending, invOut-invPending)
	out["dup-inventory"], out["dup-orders"] = dupText(invDups), dupText(ordersDups)
	out["left-inventory"], out["left-orders"] = "inventory: none", "orders: none"
	var left []string
	if deadLetters > 0 {
		left = append(left, fmt.Sprintf("dead letter %d", deadLetters))
	}
	if heldKeys > 0 {
		left = append(left, fmt.Sprintf("%d key%s held, %d parked", heldKeys, map[bool]string{true: "", false: "s"}[heldKeys == 1], parked))
	}
	if len(left) > 0 {
		out["left-inventory"] = "inventory: " + strings.Join(left, ", ")
	}
	client, err := sarama.NewClient(b.sys.Kafka.Brokers(), kafkaconf.Sarama())
	require.NoError(t, err)
	defer client.Close()
	for topic, id := range map[string]string{events.TopicOrders: "st-orders-topic", events.TopicInventory: "st-inventory-topic"} {
		parts, err := client.Partitions(topic)
		require.NoError(t, err)
		var n int64
		for _, p := range parts {
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			require.NoError(t, err)
			n += end
		}
		out[id] = fmt.Sprint(n)
	}
	return out
}

// dupText is the picture's line for n suppressed duplicates.
func dupText(n int) string {
	switch n {
	case 0:
		return "no duplicates yet"
	case 1:
		return "✕ 1 duplicate suppressed"
	}
	return fmt.Sprintf("✕ %d duplicates suppressed", n)
}

// waitPicture waits until the picture shows what want reads and also
// satisfies also, and returns it; it fails the test with both after 30s.
func (b *testBundle) waitPicture(t *testing.T, want func() map[string]string, also func(map[string]string) bool) map[string]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.browser, 10*time.Second)
		shown, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](fmt.Sprintf(`(() => {
			const out = {};
			for (const id of %s) { const e = document.getElementById(id); out[id] = e ? e.textContent.trim() : '(missing)'; }
			return out; })()`, mustJSON(pictureIDs))))
		cancel()
		require.NoError(t, err)
		w := want()
		same := true
		for _, id := range pictureIDs {
			same = same && shown[id] == w[id]
		}
		if same && also(w) {
			return shown
		}
		if time.Now().After(deadline) {
			t.Fatalf("the picture never agreed with SQL and Kafka:\npicture %v\nwant    %v", shown, w)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// steps is an ordered list of steps the page shows.
type steps struct {
	Kinds  []string `json:"kinds"`
	Texts  []string `json:"texts"`
	Wheres []string `json:"wheres"`
	Trace  string   `json:"trace"`
	Order  string   `json:"order"`
	Done   bool     `json:"done"`
}

// readSteps reads the list with id until ok, for up to a minute.
func (b *testBundle) readSteps(t *testing.T, id string, ok func(steps) bool) steps {
	t.Helper()
	js := fmt.Sprintf(`(() => {
		const ol = document.getElementById(%q), out = {kinds: [], texts: [], wheres: []};
		for (const li of ol ? ol.children : []) {
			out.kinds.push(li.dataset.kind);
			out.texts.push(li.querySelector('.what').textContent);
			const w = li.querySelector('.where'); out.wheres.push(w ? w.textContent : '');
		}
		const tr = document.getElementById('trace-id'); out.trace = tr ? tr.textContent : '';
		out.order = document.getElementById('journey').dataset.order || '';
		out.done = document.getElementById('lesson').dataset.done === 'true';
		return out; })()`, id)
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(b.browser, 10*time.Second)
		s, err := chromedp.Run(ctx, chromedp.Evaluate[steps](js))
		cancel()
		require.NoError(t, err)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("#%s never got there: %+v", id, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// screenshot saves the whole page (README shows them, refreshed with
// UPDATE_SCREENSHOT=1).
func (b *testBundle) screenshot(t *testing.T, name string) {
	t.Helper()
	browser.Screenshot(t, b.browser, name)
}
