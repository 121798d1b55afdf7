// Package e2e runs both services as real OS processes against the
// self-starting stack and judges each run with SQL (chaos/judge).
package e2e

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/stack"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) {
	var err error
	if pg, err = pgtest.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop() //nolint:errcheck
	os.Exit(code)
}

type testBundle struct {
	sys   *system.System
	stock map[string]int
	skus  []string
}

func setup(t *testing.T, opts system.Options) *testBundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	opts.Postgres = pg
	opts.DBPrefix = fmt.Sprintf("e2e_%d_", time.Now().UnixNano())
	opts.Work = t.TempDir()
	opts.Log = t.Logf
	sys, err := system.Start(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service logs are in %s", sys.Work)
		}
		sys.Stop()
	})
	b := &testBundle{sys: sys, skus: loadgen.SKUs(10)}
	b.stock = loadgen.StockFor(200, b.skus)
	require.NoError(t, sys.Client.SeedStock(ctx, b.stock))
	return b
}

// run pays n orders, at most rate per second when rate > 0, and waits until
// every paid order is settled.
func (b *testBundle) run(t *testing.T, n int, rate float64) judge.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := loadgen.Run(ctx, b.sys.Client, b.skus, loadgen.Plan{Orders: n, Concurrency: 8, DoubleSubmit: 10, Seed: 1, Rate: rate})
	require.NoError(t, err)
	require.Len(t, res.Paid, n)
	report, err := judge.Wait(ctx, b.sys.Pools["orders"], b.sys.Pools["inventory"], b.stock, res.Client(), judge.Settled(n),
		func(r judge.Report) { t.Logf("waiting: %d of %d settled", r.Reserved+r.Rejected, r.OrdersPaid) })
	require.NoError(t, err, "invariants: %+v", report.Invariants)
	require.Equal(t, n, report.OrdersPaid)
	return report
}

// audit waits until the auditor running beside the system has caught up
// with everything so far and returns its verdict, and the kinds of
// finding it raised.
func (b *testBundle) audit(t *testing.T) (judge.Invariant, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), b.sys.AuditGrace+time.Minute)
	defer cancel()
	findings, err := judge.AuditAfter(ctx, b.sys.Pools["audit"], b.sys.AuditGrace)
	require.NoError(t, err)
	kinds := map[string]int{}
	for _, f := range findings {
		kinds[f.Kind]++
	}
	return judge.AuditVerdict(findings), kinds
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	// The auditor's grace period: longer than an order takes here even on
	// a machine busy with every package's tests under -race, so a late
	// answer is not a finding.
	b := setup(t, system.Options{AuditGrace: 30 * time.Second})
	report := b.run(t, 200, 0)

	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	require.Equal(t, 200, report.Reserved+report.Rejected)
	require.Positive(t, report.Reserved)
	require.Zero(t, report.OrderPaidDup, "a double-submitted payment published two OrderPaid")
	quiet, _ := b.audit(t)
	require.True(t, quiet.OK, quiet.Detail)
	require.NoError(t, b.sys.StopServices(30*time.Second), "graceful shutdown")
}

// crashAfterCommit arms after-commit-before-ack in inventory, restarts it
// after every kill, and returns the settled report, the kill count and
// the running system. The
// two layers that stop a redelivery can be switched off: the inbox, and the
// domain guard behind it.
func crashAfterCommit(t *testing.T, inboxDisabled, guardDisabled bool) (judge.Report, int64, *testBundle) {
	return crashAfterCommitWith(t, inboxDisabled, guardDisabled, nil)
}

// crashAfterCommitWith is crashAfterCommit with the system's options shaped
// further by shape.
func crashAfterCommitWith(t *testing.T, inboxDisabled, guardDisabled bool, shape func(*system.Options)) (judge.Report, int64, *testBundle) {
	env := []string{
		"FAILPOINTS=" + string(failpoint.AfterCommitBeforeAck) + "=every:40",
		"FAILPOINT_SEED=1",
		// Let each incarnation catch up and commit offsets before it can die.
		"FAILPOINT_GRACE=1s",
		fmt.Sprintf("INBOX_DISABLED=%t", inboxDisabled),
		fmt.Sprintf("DOMAIN_GUARD_DISABLED=%t", guardDisabled),
	}
	opts := system.Options{
		Env: []string{
			"KAFKA_SESSION_TIMEOUT=1s",
			"KAFKA_REBALANCE_TIMEOUT=3s",
			"KAFKA_COMMIT_INTERVAL=200ms",
		},
		EnvFor: map[string][]string{"inventory": env},
		Kafka:  stack.KafkaOptions{MinSessionTimeout: 500 * time.Millisecond},
	}
	if shape != nil {
		shape(&opts)
	}
	b := setup(t, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var restarts atomic.Int64
	b.sys.Supervise(ctx, func() time.Duration { return 100 * time.Millisecond }, func(*procs.Proc) { restarts.Add(1) })

	// Paced, so the run outlasts FAILPOINT_GRACE: batched, 200 orders settle
	// in well under a second.
	report := b.run(t, 200, 50)
	cancel()
	return report, restarts.Load(), b
}

// TestCrashAfterCommitBeforeAck kills inventory with SIGKILL right after its
// inbox transaction committed and before Kafka heard of it. Kafka redelivers;
// the inbox must suppress every redelivery, so none reaches the domain
// guard behind it.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	report, kills, _ := crashAfterCommit(t, false, false)
	t.Logf("kills: %d, duplicates suppressed: %d, refused by the guard: %v", kills, report.DuplicatesSuppressed, report.Refused)

	require.Positive(t, kills, "the failpoint never fired")
	require.Positive(t, report.DuplicatesSuppressed, "kills after commit must cause redeliveries")
	require.Zero(t, report.RefusedTotal(), "the inbox stops redeliveries before the domain guard sees them")
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
}

// TestCrashAfterCommitBeforeAckPartitioned is the same run with both
// services' inboxes partitioned by id time (INBOX_PARTITION_INTERVAL), the
// tables converted before the services start with a cut-over already past:
// every row, and every redelivery, goes to an hour's partition. Their
// outboxes are partitioned too (OUTBOX_PARTITION_INTERVAL: the services
// convert them at start), and every outbox row is in an hour's block.
func TestCrashAfterCommitBeforeAckPartitioned(t *testing.T) {
	t.Parallel()
	p := inbox.Partitioning{Interval: time.Hour}
	report, kills, b := crashAfterCommitWith(t, false, false, func(o *system.Options) {
		o.Env = append(o.Env, "INBOX_PARTITION_INTERVAL=1h", "OUTBOX_PARTITION_INTERVAL=1h")
		o.Prepare = func(ctx context.Context, pools map[string]*pgxpool.Pool) error {
			for _, name := range system.Services {
				if err := inbox.Migrate(ctx, pools[name]); err != nil {
					return err
				}
				if err := inbox.PartitionByIDTime(ctx, pools[name], p, time.Now().Add(-time.Hour)); err != nil {
					return err
				}
			}
			return nil
		}
	})
	t.Logf("kills: %d, duplicates suppressed: %d", kills, report.DuplicatesSuppressed)
	require.Positive(t, kills, "the failpoint never fired")
	require.Positive(t, report.DuplicatesSuppressed, "kills after commit must cause redeliveries")
	require.Zero(t, report.RefusedTotal(), "the inbox stops redeliveries before the domain guard sees them")
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)
	inventory := b.sys.Pools["inventory"]
	var rows, inHours int
	require.NoError(t, inventory.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE tableoid::regclass::text LIKE 'inbox_messages_p%')
		FROM inbox_messages`).Scan(&rows, &inHours))
	require.Positive(t, rows)
	require.Equal(t, rows, inHours, "every inbox row in an hour's partition")
	require.NoError(t, inventory.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE tableoid::regclass::text LIKE 'outbox_messages_p%')
		FROM outbox_messages`).Scan(&rows, &inHours))
	require.Positive(t, rows)
	require.Equal(t, rows, inHours, "every outbox row in an hour's partition")
}

// TestCrashAfterCommitBeforeAckWithoutInbox is the first control: the same
// run with the inbox switched off. The redeliveries reach the domain, and
// the guard (inventory decides an order once) must refuse them: nothing is
// applied twice, and the refusals are counted.
func TestCrashAfterCommitBeforeAckWithoutInbox(t *testing.T) {
	t.Parallel()
	report, kills, _ := crashAfterCommit(t, true, false)
	t.Logf("kills: %d, refused by the guard: %v, double-applied orders: %d", kills, report.Refused, report.DoubleApplied)

	require.Positive(t, kills)
	require.Positive(t, report.Refused["inventory"], "without the inbox, redeliveries must reach the domain guard")
	require.True(t, report.OK(), "the guard must hold without the inbox: %+v", report.Invariants)
}

// TestCrashAfterCommitBeforeAckWithoutEitherLayer is the second control:
// inbox and guard both off must be caught applying orders twice. Without
// it, the tests above could pass with a checker that never fails.
func TestCrashAfterCommitBeforeAckWithoutEitherLayer(t *testing.T) {
	t.Parallel()
	report, kills, b := crashAfterCommit(t, true, true)
	inventory := b.sys.Pools["inventory"]
	t.Logf("kills: %d, double-applied orders: %d, sold more than once: %d", kills, report.DoubleApplied, report.EndedTwice)

	require.Positive(t, kills)
	exactlyOnce, _ := report.Invariant(judge.ExactlyOnce)
	require.False(t, exactlyOnce.OK, "without either layer, redeliveries must show up as double-applies")
	// The auditor, watching the live system, saw them too: reservations
	// that hold an order's lines more than once, units sold twice.
	quiet, kinds := b.audit(t)
	t.Logf("auditor: %s; by kind: %v", quiet.Detail, kinds)
	require.False(t, quiet.OK, "the auditor must see orders applied twice")
	require.Positive(t, kinds["wrong-quantities"], "reservations applied twice")
	require.Positive(t, kinds["wrong-sale"], "sales applied twice")
	require.Positive(t, report.DoubleApplied)
	// And for that reason alone: a redelivery applies the order's own lines
	// again, for an order that was paid, so nothing is a phantom, no
	// quantity differs from the order's and the client agrees. The stock
	// balances too, except where an OrderCaptured applied twice sold more
	// of a SKU than was reserved at that moment: reserved cannot go below
	// zero (the unguarded sale floors it there), so that SKU's reserved
	// stays above its reservations less its sales by what the floor kept,
	// sold equals its sales, and nothing else is off.
	for _, inv := range report.Invariants {
		if inv.Name != judge.ExactlyOnce && inv.Name != judge.StockConsistent {
			require.True(t, inv.OK, "the control must fail for double-applies alone; %s: %s", inv.Name, inv.Detail)
		}
	}
	rows, err := inventory.Query(t.Context(), `
		SELECT sku, available, reserved, sold, res, ful FROM (
			SELECT s.*, coalesce((SELECT sum(quantity) FROM reservations r WHERE r.sku = s.sku), 0)::bigint AS res,
				coalesce((SELECT sum(quantity) FROM fulfilments f WHERE f.sku = s.sku), 0)::bigint AS ful
			FROM stock s) x
		WHERE reserved <> res - ful OR sold <> ful`)
	require.NoError(t, err)
	off, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]any, error) { return r.Values() })
	require.NoError(t, err)
	for _, row := range off {
		t.Logf("out of balance: sku, available, reserved, sold, reservations, sales = %v", row)
		reserved, sold := row[2].(int64), row[3].(int64)
		res, ful := row[4].(int64), row[5].(int64)
		require.True(t, reserved > res-ful && sold == ful, "a SKU out of balance other than by a double sale: %v", row)
	}
	if stock, _ := report.Invariant(judge.StockConsistent); !stock.OK {
		require.NotEmpty(t, off, "stock-consistent failed: %s", stock.Detail)
		require.Positive(t, report.EndedTwice, "stock out of balance without a double sale")
	}
}
