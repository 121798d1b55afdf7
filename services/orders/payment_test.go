package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/pkg/effect"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/internal/platform"
)

// startProvider serves the payment provider stand-in on a database of its
// own, with faults.
func startProvider(t *testing.T, cfg provider.Config) (url string, ledger *pgxpool.Pool) {
	t.Helper()
	ledger = pg.TestDatabase(t)
	require.NoError(t, provider.Migrate(t.Context(), ledger))
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := provider.New(ledger, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv.URL, ledger
}

// reserve creates an order paying with card, pays it and applies its
// InventoryReserved, as the consumer would.
func reserve(t *testing.T, pool *pgxpool.Pool, card string, lines []events.Line) string {
	t.Helper()
	o, err := createOrder(t.Context(), platform.DB{Pool: pool}, lines, card)
	require.NoError(t, err)
	_, err = payOrders(t.Context(), platform.DB{Pool: pool}, []string{o.ID})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return settleOrders(t.Context(), tx, answers(t, events.InventoryReserved{
			Envelope: events.NewEnvelope(events.TypeInventoryReserved, o.ID), Lines: lines}))
	}))
	return o.ID
}

func answers(t *testing.T, evs ...any) []*message.Message {
	msgs := make([]*message.Message, len(evs))
	for i, ev := range evs {
		msgs[i] = answer(t, ev)
	}
	return msgs
}

// runCaptures runs orders' payment runners (captures, refunds) against url
// until every effect ended.
func runCaptures(t *testing.T, pool *pgxpool.Pool, cfg platform.Config) {
	t.Helper()
	cfg.EffectMinBackoff, cfg.EffectMaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	effs, err := payments(platform.DB{Pool: pool}, cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, len(effs))
	for _, eff := range effs {
		go func() { done <- eff.Run(ctx) }()
	}
	require.Eventually(t, func() bool {
		return scalar[int](t, pool, `SELECT count(*) FROM effects WHERE state = 'pending'`) == 0
	}, 30*time.Second, 20*time.Millisecond, "effects still pending")
	cancel()
	for range effs {
		require.NoError(t, <-done)
	}
}

// TestCaptureOnReserve: a reserved order's capture intent commits with the
// reservation and is made with its key through the provider's 500s and
// lost answers; each order ends captured once for its amount, with one
// OrderCaptured in the outbox for inventory (committed with the capture's
// record, however often the call was repeated), or declined (a state, not a
// retry loop, and no OrderCaptured); a rejected order captures nothing.
func TestCaptureOnReserve(t *testing.T) {
	t.Parallel()
	url, ledger := startProvider(t, provider.Config{FailRate: 0.3, LostResponseRate: 0.3, Seed: 7})
	pool := newDB(t)
	lines := []events.Line{{SKU: "sku-01", Quantity: 2}, {SKU: "sku-07", Quantity: 1}}
	var ok []string
	for range 12 {
		ok = append(ok, reserve(t, pool, defaultCard, lines))
	}
	declined := reserve(t, pool, "tok_declined", lines)
	rejected := newOrder(t, pool)
	_, err := payOrders(t.Context(), platform.DB{Pool: pool}, []string{rejected})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return settleOrders(t.Context(), tx, answers(t, events.InventoryRejected{
			Envelope: events.NewEnvelope(events.TypeInventoryRejected, rejected), Reason: "short"}))
	}))
	require.Equal(t, "capturing", scalar[string](t, pool, `SELECT payment FROM orders WHERE id = $1`, ok[0]))

	runCaptures(t, pool, platform.Config{ProviderURL: url})

	want := events.Amount(lines)
	for _, id := range ok {
		o, err := getOrder(t.Context(), pool, id)
		require.NoError(t, err)
		require.Equal(t, "captured", o.Payment, id)
		require.Equal(t, 1, scalar[int](t, ledger, `SELECT count(*) FROM captures WHERE reference = $1`, id), "captures of %s", id)
		require.Equal(t, o.CaptureID, scalar[string](t, ledger, `SELECT id FROM captures WHERE reference = $1`, id))
		require.Equal(t, want, scalar[int64](t, ledger, `SELECT amount FROM captures WHERE reference = $1`, id))
		require.Equal(t, []string{o.CaptureID}, capturedEvents(t, pool, id), "OrderCaptured of %s", id)
	}
	require.Empty(t, capturedEvents(t, pool, declined), "a declined order has not ended")
	require.Empty(t, capturedEvents(t, pool, rejected))
	o, err := getOrder(t.Context(), pool, declined)
	require.NoError(t, err)
	require.Equal(t, "declined", o.Payment)
	require.Contains(t, o.PaymentError, "declined")
	require.Equal(t, 1, scalar[int](t, ledger, `SELECT count(*) FROM captures WHERE reference = $1`, declined))
	require.Zero(t, scalar[int](t, ledger, `SELECT count(*) FROM captures WHERE reference = $1`, rejected))
	o, err = getOrder(t.Context(), pool, rejected)
	require.NoError(t, err)
	require.Empty(t, o.Payment)
}

// The control: the same faults with the key switched off capture some
// orders twice (the provider's lost answers are repeated as new captures).
func TestCaptureWithoutKeysCapturesTwice(t *testing.T) {
	t.Parallel()
	url, ledger := startProvider(t, provider.Config{LostResponseRate: 0.5, Seed: 7})
	pool := newDB(t)
	for range 12 {
		reserve(t, pool, defaultCard, oneLine)
	}
	runCaptures(t, pool, platform.Config{ProviderURL: url, EffectKeysDisabled: true})
	twice := scalar[int](t, ledger, `SELECT count(*) FROM (SELECT reference FROM captures GROUP BY reference HAVING count(*) > 1) x`)
	require.Positive(t, twice, "without keys, a lost answer must be captured again")
}

// TestRetryDeclinedCapture: a person acts on a declined capture. The retry
// with another card is a new capture under the attempt's own key, made
// once through the provider's faults; the ledger holds the decline and the
// capture, and the order records the capture. A retry of a captured order,
// of one still capturing, of one not reserved, of an unknown one, or with a
// malformed card, is refused with its reason.
func TestRetryDeclinedCapture(t *testing.T) {
	t.Parallel()
	url, ledger := startProvider(t, provider.Config{FailRate: 0.3, LostResponseRate: 0.3, Seed: 11})
	pool := newDB(t)
	declined := reserve(t, pool, "tok_declined", oneLine)
	paid := reserve(t, pool, defaultCard, oneLine)
	runCaptures(t, pool, platform.Config{ProviderURL: url})
	o, err := getOrder(t.Context(), pool, declined)
	require.NoError(t, err)
	require.Equal(t, "declined", o.Payment)

	o, err = retryCapture(t.Context(), platform.DB{Pool: pool}, declined, "tok_mastercard")
	require.NoError(t, err)
	require.Equal(t, "capturing", o.Payment)
	_, err = retryCapture(t.Context(), platform.DB{Pool: pool}, declined, "")
	require.ErrorAs(t, err, new(errRetryRefused), "a capture being made is not retried")
	runCaptures(t, pool, platform.Config{ProviderURL: url})

	o, err = getOrder(t.Context(), pool, declined)
	require.NoError(t, err)
	require.Equal(t, "captured", o.Payment)
	require.Equal(t, [][]any{{"declined", "tok_declined", events.CaptureKey(declined)}, {"captured", "tok_mastercard", events.RetryCaptureKey(declined, 2)}},
		rows(t, ledger, `SELECT status, source, idempotency_key FROM captures WHERE reference = $1 ORDER BY seq`, declined))
	require.Equal(t, o.CaptureID, scalar[string](t, ledger, `SELECT id FROM captures WHERE reference = $1 AND status = 'captured'`, declined))
	require.Equal(t, []string{o.CaptureID}, capturedEvents(t, pool, declined), "captured on the retry: the order ends")

	_, err = retryCapture(t.Context(), platform.DB{Pool: pool}, paid, "")
	require.ErrorContains(t, err, "payment is captured")
	unpaid := newOrder(t, pool)
	_, err = retryCapture(t.Context(), platform.DB{Pool: pool}, unpaid, "")
	require.ErrorContains(t, err, "is created")
	_, err = retryCapture(t.Context(), platform.DB{Pool: pool}, uuid.NewString(), "")
	require.ErrorIs(t, err, errNotFound)
}

// capturedEvents returns the capture ids of the OrderCaptured events in the
// outbox for order id.
func capturedEvents(t *testing.T, pool *pgxpool.Pool, id string) []string {
	t.Helper()
	var ids []string
	for _, r := range rows(t, pool, `SELECT payload FROM outbox_messages WHERE topic = $1 AND partition_key = $2 ORDER BY id`, events.TopicOrders, id) {
		ev, err := events.Decode(r[0].([]byte))
		require.NoError(t, err)
		if c, ok := ev.(*events.OrderCaptured); ok {
			ids = append(ids, c.CaptureID)
		}
	}
	return ids
}

func rows(t *testing.T, pool *pgxpool.Pool, q string, args ...any) [][]any {
	t.Helper()
	r, err := pool.Query(t.Context(), q, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(r, func(row pgx.CollectableRow) ([]any, error) { return row.Values() })
	require.NoError(t, err)
	return out
}

// TestRecordCapturesTogether: the outcomes recorded in one transaction each
// end their own order, captured (with its OrderCaptured), declined or
// failed, and an outcome of an attempt the order has left (a person retried
// it meanwhile) changes nothing.
func TestRecordCapturesTogether(t *testing.T) {
	t.Parallel()
	pool := newDB(t)
	captured1, declined, failed, retried := reserve(t, pool, defaultCard, oneLine), reserve(t, pool, defaultCard, oneLine),
		reserve(t, pool, defaultCard, oneLine), reserve(t, pool, defaultCard, oneLine)
	_, err := pool.Exec(t.Context(), `UPDATE orders SET capture_attempt = 2 WHERE id = $1`, retried)
	require.NoError(t, err)
	outcome := func(id string, c captured, err error) effect.Outcome[captured] {
		payload, merr := json.Marshal(capture{OrderID: id, Amount: 100, Currency: events.Currency, Card: defaultCard})
		require.NoError(t, merr)
		return effect.Outcome[captured]{Effect: effect.Effect{Kind: captureKind, Key: events.CaptureKey(id), Payload: payload}, Result: c, Err: err}
	}
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return recordCaptures(t.Context(), tx, []effect.Outcome[captured]{
			outcome(captured1, captured{ID: "cap_1", Status: "captured"}, nil),
			outcome(declined, captured{ID: "cap_2", Status: "declined", DeclineCode: "card_declined"}, nil),
			outcome(failed, captured{}, effect.Permanent(errors.New("provider refused the request: 400"))),
			outcome(retried, captured{ID: "cap_4", Status: "captured"}, nil), // attempt 1; the order is at 2
		})
	}))
	for id, want := range map[string][]any{
		captured1: {"captured", "cap_1", ""},
		declined:  {"declined", "cap_2", "the provider declined the card: card_declined"},
		failed:    {"failed", "", "provider refused the request: 400"},
		retried:   {"capturing", "", ""},
	} {
		require.Equal(t, [][]any{want}, rows(t, pool, `SELECT payment, coalesce(capture_id, ''), coalesce(payment_error, '') FROM orders WHERE id = $1`, id), id)
	}
	require.Equal(t, []string{"cap_1"}, capturedEvents(t, pool, captured1))
	for _, id := range []string{declined, failed, retried} {
		require.Empty(t, capturedEvents(t, pool, id), id)
	}
}

// TestStatementsStayCheapAsTheTablesGrow: a service that started on empty
// tables, as a new deployment does, reads a few rows of orders per order
// once the table holds a history, with no ANALYZE since. Before, settling
// (UPDATE orders … FROM unnest) and recording captures kept the plans their
// statements were prepared with while orders was empty, hash joins over a
// full scan, and read every order ever placed for each batch.
func TestStatementsStayCheapAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	base := newDB(t)
	for _, table := range []string{"orders", "order_events", "effects", "outbox_messages"} {
		_, err := base.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = off)`) // no ANALYZE replans behind the test
		require.NoError(t, err)
	}
	pool, plans := pgtest.Explained(t, base, func(c *pgxpool.Config) { c.MaxConns = 1 }) // one session: each statement prepared once
	order := func() {
		id := reserve(t, pool, defaultCard, oneLine)
		payload, err := json.Marshal(capture{OrderID: id, Amount: 100, Currency: events.Currency, Card: defaultCard})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return recordCaptures(ctx, tx, []effect.Outcome[captured]{{
				Effect: effect.Effect{Kind: captureKind, Key: events.CaptureKey(id), Payload: payload},
				Result: captured{ID: "cap_" + id[:8], Status: "captured"}}})
		}))
		require.Equal(t, "captured", scalar[string](t, base, `SELECT payment FROM orders WHERE id = $1`, id))
		// The rarer paths that find an order by its id: reading it, paying
		// it again, a second answer for it, retrying its capture.
		_, err = getOrder(ctx, pool, id)
		require.NoError(t, err)
		_, err = payOrders(ctx, platform.DB{Pool: pool}, []string{id})
		require.NoError(t, err)
		require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return settleOrders(ctx, tx, answers(t, events.InventoryReserved{
				Envelope: events.NewEnvelope(events.TypeInventoryReserved, id), Lines: oneLine}))
		}))
		_, err = retryCapture(ctx, platform.DB{Pool: pool}, id, "")
		require.ErrorAs(t, err, new(errRetryRefused))
	}
	for range 2 { // a new deployment: tables of a few rows, analyzed (see inventory's test)
		order()
	}
	_, err := base.Exec(ctx, `ANALYZE`)
	require.NoError(t, err)
	for range 6 {
		order()
	}
	_, err = base.Exec(ctx, `INSERT INTO orders SELECT (jsonb_populate_record(NULL::orders,
		to_jsonb(o) || jsonb_build_object('id', gen_random_uuid()))).* FROM orders o, generate_series(1, 2500)`)
	require.NoError(t, err)
	require.Equal(t, 20008, scalar[int](t, base, `SELECT count(*) FROM orders`))
	plans.Take()
	for range 3 {
		order()
	}
	ran := plans.Take()
	explained := map[string]int{}
	for _, p := range ran {
		for _, what := range []string{"SET status = 'paid'", "SET status = u.status", "SET payment = u.state",
			"FROM orders WHERE id = $1", "FROM orders WHERE id = ANY", "SET payment = 'capturing'"} {
			if strings.Contains(p.Query, what) {
				explained[what]++
			}
		}
	}
	require.Empty(t, pgtest.Costly(ran, 20, "orders"), "statements that read more than 20 rows of orders (20,000 of history) for one order")
	require.Equal(t, map[string]int{
		"SET status = 'paid'": 6, "SET status = u.status": 6, "SET payment = u.state": 3, // paid twice, settled twice
		"FROM orders WHERE id = $1": 6, "FROM orders WHERE id = ANY": 6, "SET payment = 'capturing'": 3, // read, paid again, answered again, retried
	}, explained, "the three orders' statements were not all explained")
}
