package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// runScenario runs one order through the system with one kill at window w,
// and narrates what happened.
func runScenario(ctx context.Context, w failpoint.Name) error {
	sc, ok := judge.Windows[w]
	if !ok {
		var names []string
		for _, n := range failpoint.All {
			names = append(names, string(n))
		}
		return fmt.Errorf("unknown window %q; the windows are: %s", w, strings.Join(names, ", "))
	}
	start := time.Now()
	step := 0
	say := func(format string, args ...any) {
		step++
		fmt.Printf("\n%d. %s\n", step, fmt.Sprintf(format, args...))
	}
	note := func(format string, args ...any) { fmt.Printf("   %s\n", fmt.Sprintf(format, args...)) }

	work, err := os.MkdirTemp("", "chaos-scenario-")
	if err != nil {
		return err
	}
	fpLog := filepath.Join(work, "failpoints.log")
	armed := false
	fmt.Printf("scenario %s: one order, one SIGKILL of %s at that window (logs in %s)\n", w, sc.Victim, work)
	sys, err := system.Start(ctx, system.Options{
		Work: work,
		Env: []string{"KAFKA_SESSION_TIMEOUT=1s", "KAFKA_REBALANCE_TIMEOUT=3s", "KAFKA_COMMIT_INTERVAL=200ms", "RELAY_POLL_INTERVAL=100ms",
			"EFFECT_LEASE=3s", "FAILPOINT_LOG=" + fpLog},
		Kafka: stack.KafkaOptions{MinSessionTimeout: 500 * time.Millisecond},
		EnvHook: func(p *procs.Proc) []string {
			if p.Service != sc.Victim || armed {
				return nil // restarted incarnations run unarmed
			}
			armed = true
			return []string{fmt.Sprintf("FAILPOINTS=%s=every:1", w)}
		},
	})
	if err != nil {
		return err
	}
	defer sys.Stop()
	orders, inventory := sys.Pools["orders"], sys.Pools["inventory"]
	victim := sys.Procs[sc.Victim][0]
	stock := map[string]int{"sku-01": 10}
	if err := sys.Client.SeedStock(ctx, stock); err != nil {
		return err
	}
	fmt.Printf("   the stack is up: orders and inventory run as OS processes; %s is armed to SIGKILL itself at %s\n", sc.Victim, w)

	order, err := sys.Client.CreateOrder(ctx, []events.Line{{SKU: "sku-01", Quantity: 2}})
	if err != nil {
		return err
	}
	say("Created order %s: 2 × sku-01 (inventory has 10).", order.ID)

	say("Paying it. orders runs ONE transaction: UPDATE orders SET status = 'paid' and INSERT the OrderPaid row into its outbox.")
	payErr := make(chan error, 1)
	go func() {
		_, err := sys.Client.Pay(ctx, order.ID) // retries until some incarnation answers
		payErr <- err
	}()

	killCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	select {
	case <-victim.Exited():
	case <-killCtx.Done():
		return errors.New("the window was never reached")
	}
	line, subject := lastKill(fpLog)
	say("%s was killed: %s", sc.Victim, line)
	note("At that moment %s", sc.Before)
	if err := narrateState(ctx, orders, inventory, order.ID, subject, note); err != nil {
		return err
	}
	if judge.EffectWindow(w) {
		if err := narrateCapture(ctx, sys, order.ID, note); err != nil {
			return err
		}
	}

	say("A supervisor restarts %s (unarmed this time), as an orchestrator would.", sc.Victim)
	time.Sleep(200 * time.Millisecond)
	if err := victim.Start(); err != nil {
		return err
	}
	readyCtx, cancelReady := context.WithTimeout(ctx, 30*time.Second)
	defer cancelReady()
	if err := victim.WaitReady(readyCtx); err != nil {
		return err
	}
	note("%s is back (pid %d). It rejoins its Kafka consumer group; partitions are reassigned.", sc.Victim, victim.Pid())
	if err := <-payErr; err != nil {
		return fmt.Errorf("paying: %w", err)
	}

	waitCtx, cancelWait := context.WithTimeout(ctx, time.Minute)
	defer cancelWait()
	// The client paid this one order and saw it paid.
	client := &judge.Client{Paid: []string{order.ID}}
	report, err := judge.Wait(waitCtx, orders, inventory, stock, client, func(r judge.Report) bool {
		return judge.Settled(1)(r) && (w != failpoint.AfterCommitBeforeAck && w != failpoint.AfterPublishBeforeMark || r.DuplicatesSuppressed > 0)
	}, nil)
	if err != nil {
		return fmt.Errorf("order did not settle: %w", err)
	}
	say("The order settled. What the databases say now:")
	if err := narrateState(ctx, orders, inventory, order.ID, subject, note); err != nil {
		return err
	}
	if judge.EffectWindow(w) {
		if err := narrateCapture(ctx, sys, order.ID, note); err != nil {
			return err
		}
		pay, err := judge.CheckPayments(ctx, orders, sys.Pools["provider"])
		if err != nil {
			return err
		}
		report.Invariants = append(report.Invariants, pay.Invariant)
	}
	say("Why nothing was applied twice: %s", sc.Why)
	fmt.Println()
	for _, inv := range report.Invariants {
		status := "PASS"
		if !inv.OK {
			status = "FAIL"
		}
		fmt.Printf("   %s  %-19s %s\n", status, inv.Name, inv.Detail)
	}
	fmt.Printf("\n(%s)\n", time.Since(start).Round(time.Millisecond))
	if !report.OK() {
		return errors.New("an invariant failed")
	}
	return nil
}

// lastKill returns the last line of the failpoint log and its subject.
func lastKill(path string) (string, string) {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	last := lines[len(lines)-1]
	fields := strings.Fields(last)
	if len(fields) >= 8 {
		return last, fields[7]
	}
	return last, ""
}

// narrateState prints the rows that tell the story of one order.
func narrateState(ctx context.Context, orders, inventory *pgxpool.Pool, orderID, subject string, note func(string, ...any)) error {
	var status string
	var orderPaid, published int
	if err := orders.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, orderID).Scan(&status); err != nil {
		return err
	}
	if err := orders.QueryRow(ctx, `SELECT count(*), count(published_at) FROM outbox_messages WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3`,
		events.TopicOrders, orderID, events.TypeOrderPaid).Scan(&orderPaid, &published); err != nil {
		return err
	}
	note("orders:    order status %q; OrderPaid rows in the outbox: %d (%d marked published)", status, orderPaid, published)

	var msgID string
	_ = orders.QueryRow(ctx, `SELECT message_id::text FROM outbox_messages WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3`,
		events.TopicOrders, orderID, events.TypeOrderPaid).Scan(&msgID)
	var inboxRows, dups, reservations, answers int
	if msgID != "" {
		if err := inventory.QueryRow(ctx, `SELECT count(*), coalesce(max(duplicates), 0) FROM inbox_messages WHERE message_id = $1`,
			msgID).Scan(&inboxRows, &dups); err != nil {
			return err
		}
	}
	if err := inventory.QueryRow(ctx, `SELECT count(*) FROM reservations WHERE order_id = $1`, orderID).Scan(&reservations); err != nil {
		return err
	}
	if err := inventory.QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE partition_key = $1`, orderID).Scan(&answers); err != nil {
		return err
	}
	note("inventory: inbox row for OrderPaid %s: %d (duplicates suppressed: %d); reservations: %d; InventoryReserved in its outbox: %d",
		short(msgID), inboxRows, dups, reservations, answers)
	var applied int
	if err := orders.QueryRow(ctx, `SELECT count(*) FROM order_events WHERE order_id = $1`, orderID).Scan(&applied); err != nil {
		return err
	}
	note("orders:    inventory answers applied to the order: %d", applied)
	if subject != "" && subject != orderID && subject != msgID {
		note("(the killed code was working on message %s)", short(subject))
	}
	return nil
}

// narrateCapture prints what orders, its effects table and the provider's
// ledger and log say of the order's capture.
func narrateCapture(ctx context.Context, sys *system.System, orderID string, note func(string, ...any)) error {
	key := events.CaptureKey(orderID)
	var payment, state, lastErr string
	var attempts int
	if err := sys.Pools["orders"].QueryRow(ctx, `SELECT coalesce(payment, '') FROM orders WHERE id = $1`, orderID).Scan(&payment); err != nil {
		return err
	}
	if err := sys.Pools["orders"].QueryRow(ctx, `SELECT state, attempts, coalesce(last_error, '') FROM effects WHERE key = $1`, key).
		Scan(&state, &attempts, &lastErr); err != nil {
		return err
	}
	note("orders:    payment %q; effect %s: %s after %d call%s%s", payment, key, state, attempts,
		map[bool]string{true: "", false: "s"}[attempts == 1], map[bool]string{true: "", false: " (last error: " + lastErr + ")"}[lastErr == ""])
	rows, err := sys.Pools["provider"].Query(ctx, `SELECT id, status, amount FROM captures WHERE reference = $1 ORDER BY seq`, orderID)
	if err != nil {
		return err
	}
	var ledger []string
	var id, status string
	var amount int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &status, &amount}, func() error {
		ledger = append(ledger, fmt.Sprintf("%s %s %d", id, status, amount))
		return nil
	}); err != nil {
		return err
	}
	replays, err := provider.ReadReplays(filepath.Join(sys.Work, "provider.log"))
	if err != nil {
		return err
	}
	note("provider:  captures in its ledger for the order: %d %v; requests with the key answered with the stored response (Idempotent-Replayed: true): %d",
		len(ledger), ledger, replays[key])
	return nil
}

func short(id string) string {
	if len(id) > 13 {
		return id[:13] + "…"
	}
	return id
}
