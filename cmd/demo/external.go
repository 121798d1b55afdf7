package main

// External mode: the demo against services that are already running, as the
// `demo` container of docker-compose.yml runs it. Set ORDERS_URL and
// INVENTORY_URL (and ORDERS_DATABASE_URL, INVENTORY_DATABASE_URL,
// KAFKA_BROKERS) and the demo starts nothing itself: it seeds stock, follows
// three orders through both services (one paid twice at once, one whose
// OrderPaid it replays onto Kafka, one that cannot be reserved), pays the
// -orders load, and checks with SQL that every paid order ended reserved or
// rejected, exiting non-zero otherwise.
//
// The databases may hold earlier runs (`docker compose run demo` again): the
// checks count this run's orders against what was there before.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
	"github.com/outboxref/outbox-inbox/services/events"
)

// externalEnv are the variables of external mode; ORDERS_URL or
// INVENTORY_URL switches it on, and then all are required. (Where the
// services sign their events, ORDERS_SIGNING_KEY, orders' SIGNING_KEY,
// signs the replay; where they require a credential, HTTP_TOKEN is it.)
var externalEnv = []string{"ORDERS_URL", "INVENTORY_URL", "ORDERS_DATABASE_URL", "INVENTORY_DATABASE_URL", "KAFKA_BROKERS"}

type external struct {
	ordersURL, inventoryURL string
	ordersDB, inventoryDB   string
	brokers                 []string
	sign                    signer // ORDERS_SIGNING_KEY: the replay is signed as orders' relay signs
	token                   string // HTTP_TOKEN: the services' credential for state-changing requests
}

// externalFromEnv reports whether external mode is on, and its settings.
func externalFromEnv() (external, bool, error) {
	if os.Getenv("ORDERS_URL") == "" && os.Getenv("INVENTORY_URL") == "" {
		return external{}, false, nil
	}
	var missing []string
	for _, name := range externalEnv {
		if strings.TrimSpace(os.Getenv(name)) == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return external{}, true, fmt.Errorf("external mode (ORDERS_URL/INVENTORY_URL set) needs %s too", strings.Join(missing, ", "))
	}
	ext := external{
		ordersURL:    strings.TrimRight(os.Getenv("ORDERS_URL"), "/"),
		inventoryURL: strings.TrimRight(os.Getenv("INVENTORY_URL"), "/"),
		ordersDB:     os.Getenv("ORDERS_DATABASE_URL"),
		inventoryDB:  os.Getenv("INVENTORY_DATABASE_URL"),
		brokers:      stack.KafkaBrokersFromEnv(),
		token:        strings.TrimSpace(os.Getenv("HTTP_TOKEN")),
	}
	// Where the services sign (SIGNING_KEY), the replay of a published
	// OrderPaid must carry orders' signature, as the relay's copy did;
	// unsigned, inventory would quarantine it as not authenticated instead
	// of suppressing it as a duplicate.
	if raw := strings.TrimSpace(os.Getenv("ORDERS_SIGNING_KEY")); raw != "" {
		k, err := signature.ParseKey(raw)
		if err != nil {
			return external{}, true, fmt.Errorf("ORDERS_SIGNING_KEY: %w", err)
		}
		ext.sign = func(topic string, msg *message.Message) {
			signature.Sign(k, topic, msg.Metadata.Get(outbox.KeyMetadata), msg)
		}
	}
	return ext, true, nil
}

// followed is an order the demo narrates from payment to settlement, read
// back from both databases.
type followed struct {
	id    string
	lines []events.Line
	story string // "paid", "paid twice at once"
}

func runExternal(ctx context.Context, o options, ext external) error {
	say("external mode: orders %s, inventory %s, kafka %s", ext.ordersURL, ext.inventoryURL, strings.Join(ext.brokers, ","))
	if err := waitReady(ctx, 2*time.Minute, ext.ordersURL, ext.inventoryURL); err != nil {
		return err
	}
	orders, err := openPool(ctx, ext.ordersDB)
	if err != nil {
		return fmt.Errorf("orders database: %w", err)
	}
	defer orders.Close()
	inventory, err := openPool(ctx, ext.inventoryDB)
	if err != nil {
		return fmt.Errorf("inventory database: %w", err)
	}
	defer inventory.Close()

	var before int
	if err := orders.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status <> 'created'`).Scan(&before); err != nil {
		return fmt.Errorf("counting earlier orders: %w", err)
	}
	if before > 0 {
		say("the orders database already holds %d paid orders from earlier runs; this run is checked on top of them", before)
	}

	client := loadgen.NewClient([]string{ext.ordersURL}, []string{ext.inventoryURL})
	client.Token = ext.token
	skus := loadgen.SKUs(20)
	stock := loadgen.StockFor(o.orders, skus)
	if err := client.SeedStock(ctx, stock); err != nil {
		return fmt.Errorf("seeding stock: %w", err)
	}
	scarce := skus[len(skus)-1]
	say("seeded %d SKUs (two of them scarce: %s has %d, so some orders are rejected)", len(stock), scarce, stock[scarce])

	// Three orders to follow: a plain one whose OrderPaid is replayed later,
	// one paid twice at once, one asking for more than there is.
	replayed := followed{lines: []events.Line{{SKU: skus[7], Quantity: 3}}, story: "paid"}
	double := followed{lines: []events.Line{{SKU: skus[2], Quantity: 1}, {SKU: skus[5], Quantity: 2}}, story: "paid twice at once"}
	short := followed{lines: []events.Line{{SKU: scarce, Quantity: stock[scarce] + 1}}, story: "paid"}
	for _, f := range []*followed{&replayed, &double, &short} {
		ord, err := client.CreateOrder(ctx, f.lines)
		if err != nil {
			return fmt.Errorf("creating an order: %w", err)
		}
		f.id = ord.ID
		say("order %s created (%s): %s", short8(f.id), f.id, describeLines(f.lines))
	}
	if _, err := client.Pay(ctx, replayed.id); err != nil {
		return fmt.Errorf("paying order %s: %w", replayed.id, err)
	}
	if err := payTwiceAtOnce(ctx, client, double.id); err != nil {
		return err
	}
	var paidEvents int
	if err := orders.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3`,
		events.TopicOrders, double.id, events.TypeOrderPaid).Scan(&paidEvents); err != nil {
		return err
	}
	say("order %s paid twice at once on purpose: both requests answered \"paid\"; the outbox holds %d OrderPaid for it", short8(double.id), paidEvents)
	if _, err := client.Pay(ctx, short.id); err != nil {
		return fmt.Errorf("paying order %s: %w", short.id, err)
	}

	start := time.Now()
	res, err := loadgen.Run(ctx, client, skus, loadgen.Plan{
		Orders: o.orders, Concurrency: o.concurrency, DoubleSubmit: 50, Seed: o.seed,
	})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	say("paid %d more orders in %s (%d of them paid twice at once on purpose)", len(res.Paid), time.Since(start).Round(time.Millisecond), res.DoubleSubmits)
	paidIDs := []string{replayed.id, double.id, short.id}
	for _, p := range res.Paid {
		paidIDs = append(paidIDs, p.ID)
	}

	waitCtx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()
	// The replayed message must be one inventory already applied: wait for
	// its order to settle first.
	if err := waitSettled(waitCtx, orders, replayed.id); err != nil {
		return err
	}
	msgID, err := replayOrderPaid(ctx, orders, ext.brokers, replayed.id, ext.sign)
	if err != nil {
		return fmt.Errorf("replaying a message: %w", err)
	}
	say("replayed OrderPaid %s (order %s) onto %s on purpose: inventory already applied it, its inbox must suppress it", msgID, short8(replayed.id), events.TopicOrders)

	settled := judge.Settled(before + len(paidIDs))
	// No client view: the databases may hold earlier runs' orders, which
	// this process never saw (checkThisRun follows this run's by id).
	report, err := judge.Wait(waitCtx, orders, inventory, nil, nil,
		func(r judge.Report) bool {
			return settled(r) && suppressed(waitCtx, inventory, msgID) > 0
		},
		func(r judge.Report) {
			say("waiting: %s", progressLine(r))
		})
	if err != nil && waitCtx.Err() == nil {
		return err
	}

	say("")
	for _, f := range []followed{replayed, double, short} {
		line, err := flow(ctx, orders, inventory, f)
		if err != nil {
			return err
		}
		say("%s", line)
	}
	printReport(report, time.Since(start))
	if !report.OK() {
		return errors.New("an invariant failed (see above)")
	}
	if err != nil {
		return fmt.Errorf("not settled within %s (duplicates of %s suppressed: %d)", o.deadline, msgID, suppressed(ctx, inventory, msgID))
	}
	return checkThisRun(ctx, orders, paidIDs)
}

// checkThisRun verifies that every order this run paid ended reserved or
// rejected.
func checkThisRun(ctx context.Context, orders *pgxpool.Pool, ids []string) error {
	rows, err := orders.Query(ctx, `SELECT status, count(*) FROM orders WHERE id = ANY($1::uuid[]) GROUP BY status`, ids)
	if err != nil {
		return fmt.Errorf("checking this run's orders: %w", err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			return err
		}
		counts[status] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	ended := counts["reserved"] + counts["rejected"]
	if ended != len(ids) {
		return fmt.Errorf("%d of the %d orders paid in this run ended reserved or rejected (%v)", ended, len(ids), counts)
	}
	say("every paid order ended reserved or rejected: %d paid in this run, %d reserved, %d rejected", len(ids), counts["reserved"], counts["rejected"])
	say("PASS")
	return nil
}

// flow tells, from both databases, what became of one order:
//
//	order …3f2a9c1d paid → OrderPaid …77e0b6a2 published → inventory reserved 3 × sku-07 → duplicate delivery of …77e0b6a2 suppressed → order …3f2a9c1d reserved
func flow(ctx context.Context, orders, inventory *pgxpool.Pool, f followed) (string, error) {
	parts := []string{fmt.Sprintf("order %s %s", short8(f.id), f.story)}

	rows, err := orders.Query(ctx, `
		SELECT message_id::text, published_at IS NOT NULL FROM outbox_messages
		WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3 ORDER BY id`, events.TopicOrders, f.id, events.TypeOrderPaid)
	if err != nil {
		return "", err
	}
	var msgIDs []string
	for rows.Next() {
		var id string
		var published bool
		if err := rows.Scan(&id, &published); err != nil {
			return "", err
		}
		state := "published"
		if !published {
			state = "NOT published"
		}
		msgIDs = append(msgIDs, id)
		parts = append(parts, fmt.Sprintf("OrderPaid %s %s", short8(id), state))
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if len(msgIDs) == 0 {
		parts = append(parts, "no OrderPaid in the outbox")
	}

	var reserved []string
	rows, err = inventory.Query(ctx, `SELECT sku, quantity FROM reservations WHERE order_id = $1 ORDER BY sku, id`, f.id)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var sku string
		var qty int
		if err := rows.Scan(&sku, &qty); err != nil {
			return "", err
		}
		reserved = append(reserved, fmt.Sprintf("%d × %s", qty, sku))
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	var rejections []string
	rows, err = inventory.Query(ctx, `SELECT reason FROM rejections WHERE order_id = $1 ORDER BY id`, f.id)
	if err != nil {
		return "", err
	}
	for rows.Next() {
		var reason string
		if err := rows.Scan(&reason); err != nil {
			return "", err
		}
		rejections = append(rejections, reason)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	switch {
	case len(reserved) > 0:
		parts = append(parts, "inventory reserved "+strings.Join(reserved, ", "))
	case len(rejections) > 0:
		parts = append(parts, "inventory rejected it ("+strings.Join(rejections, "; ")+")")
	default:
		parts = append(parts, "inventory has not applied it")
	}
	for _, id := range msgIDs {
		if n := suppressed(ctx, inventory, id); n > 0 {
			parts = append(parts, fmt.Sprintf("duplicate delivery of %s suppressed", short8(id)))
			if n > 1 {
				parts[len(parts)-1] += fmt.Sprintf(" (%d×)", n)
			}
		}
	}

	var status string
	if err := orders.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, f.id).Scan(&status); err != nil {
		return "", err
	}
	parts = append(parts, fmt.Sprintf("order %s %s", short8(f.id), status))
	return strings.Join(parts, " → "), nil
}

// suppressed is how many redeliveries of msgID the inventory inbox skipped.
func suppressed(ctx context.Context, inventory *pgxpool.Pool, msgID string) int {
	var n int
	err := inventory.QueryRow(ctx, `SELECT duplicates FROM inbox_messages WHERE consumer = 'inventory' AND message_id = $1`, msgID).Scan(&n)
	if err != nil {
		return 0
	}
	return n
}

// replayOrderPaid publishes the order's already-published OrderPaid again,
// with its id, key and payload, as a relay that crashed before marking it
// would.
func replayOrderPaid(ctx context.Context, orders *pgxpool.Pool, brokers []string, orderID string, sign signer) (string, error) {
	var id, key string
	var payload []byte
	err := orders.QueryRow(ctx, `
		SELECT message_id::text, partition_key, payload FROM outbox_messages
		WHERE topic = $1 AND partition_key = $2 AND published_at IS NOT NULL AND `+events.OutboxType+` = $3 ORDER BY id LIMIT 1`,
		events.TopicOrders, orderID, events.TypeOrderPaid).Scan(&id, &key, &payload)
	if err != nil {
		return "", fmt.Errorf("reading the OrderPaid of order %s: %w", orderID, err)
	}
	return id, republish(brokers, id, key, payload, sign)
}

// payTwiceAtOnce sends two payments of one order at the same moment.
func payTwiceAtOnce(ctx context.Context, client *loadgen.Client, id string) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := client.Pay(ctx, id)
			if err == nil && o.Status == "created" {
				err = fmt.Errorf("order %s still created after paying", id)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitSettled waits until the order is reserved or rejected.
func waitSettled(ctx context.Context, orders *pgxpool.Pool, id string) error {
	for {
		var status string
		err := orders.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, id).Scan(&status)
		if err == nil && (status == "reserved" || status == "rejected") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("order %s not settled (status %q, last error %v): %w", id, status, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReady polls each base URL's /readyz until it answers 200.
func waitReady(ctx context.Context, timeout time.Duration, urls ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, base := range urls {
		said := false
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = errors.New(resp.Status)
			}
			if !said {
				say("waiting for %s/readyz (%v)", base, err)
				said = true
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s not ready: %w (last: %v)", base, ctx.Err(), err)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	say("orders and inventory are ready")
	return nil
}

// openPool connects, retrying for up to a minute while the database starts.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = pool.Ping(pctx)
		cancel()
		if err == nil {
			return pool, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			pool.Close()
			return nil, err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// short8 abbreviates a UUID to its last 8 hex digits: UUIDv7s made in the
// same second share their first ones.
func short8(id string) string {
	if len(id) <= 8 {
		return id
	}
	return "…" + id[len(id)-8:]
}

func describeLines(lines []events.Line) string {
	parts := make([]string, len(lines))
	for i, l := range lines {
		parts[i] = fmt.Sprintf("%d × %s", l.Quantity, l.SKU)
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
