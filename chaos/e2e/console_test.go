package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/chaos/browser"
	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/loadgen"
	"github.com/outboxref/outbox-inbox/chaos/procs"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/services/events"
)

// TestConsoleInTheBrowser drives inventory's console (pkg/console, on
// CONSOLE_ADDR) in Chromium, against the system on real Postgres and a
// Kafka-protocol broker. A bad deploy of inventory (BAD_DEPLOY)
// dead-letters 1,000 orders' OrderPaid: the console shows them as one
// group of 1,000. A viewer sees no action. Inventory fixed (restarted
// without BAD_DEPLOY), an operator retries the group: the preview counts
// 1,000, the confirmation starts the action, and inventory is killed with
// SIGKILL in the middle of it, a batch's transaction open; restarted, its
// console resumes the action, which finishes with each message written
// back once, and the judge finds every order settled and nothing applied
// twice. A group of garbage is dropped, with why, and the history shows
// both actions and who did them.
//
// A redrive writes each message back through inventory's outbox to its
// redrive topic (inventory.redrive), under the reference ACLs: inventory
// may not write orders' topic.
func TestConsoleInTheBrowser(t *testing.T) {
	t.Parallel()
	chrome := browser.Chromium(t)
	const orders = 1000
	addr, err := procs.FreeAddr()
	require.NoError(t, err)
	alice, vic := "alice:operator:"+secret(t), "vic:viewer:"+secret(t)
	b := setup(t, system.Options{EnvFor: map[string][]string{"inventory": {
		"BAD_DEPLOY=1", "CONSOLE_ADDR=" + addr, "CONSOLE_USERS=" + alice + "," + vic}}})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	inventory := b.sys.Procs["inventory"][0]
	pool := b.sys.Pools["inventory"]
	base := "http://" + addr

	res, err := loadgen.Run(ctx, b.sys.Client, b.skus, loadgen.Plan{Orders: orders, Concurrency: 8, Seed: 3})
	require.NoError(t, err)
	require.Len(t, res.Paid, orders)
	awaitCount(t, ctx, "inventory dead-letters every order", orders, func() int {
		return count(t, ctx, pool, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'dead_letter' AND resolved_at IS NULL`)
	})
	// And garbage no producer sent: quarantined as invalid, a group to drop.
	for range 3 {
		publish(t, b, events.TopicOrders, message.NewMessage(uuid.NewString(), []byte("<b>not an event</b>")))
	}
	awaitCount(t, ctx, "the garbage quarantined", 3, func() int {
		return count(t, ctx, pool, `SELECT count(*) FROM inbox_quarantine WHERE kind = 'invalid'`)
	})

	session := browser.Start(t, chrome, 1280, 900)
	operator, viewer := as(t, session, alice), as(t, session, vic)

	// One group of a thousand, and the garbage's.
	require.NoError(t, chromedp.Do(operator, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.ID("groups"))))
	groups := texts(t, operator, "#groups tr td.count")
	require.Equal(t, []string{"1000", "3"}, groups, "a bad deploy's thousand as one group, then the garbage")
	browser.Screenshot(t, operator, "console-groups.png")

	// A viewer reads, and has nothing to act with.
	require.NoError(t, chromedp.Do(viewer, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.ID("groups")),
		chromedp.Click(chromedp.CSS("#groups tr:nth-child(2) a")), chromedp.WaitVisible(chromedp.ID("messages"))))
	require.Zero(t, countOf(t, viewer, "#bulk-retry, #bulk-drop, form"), "a viewer sees no form")

	// The fix: inventory restarted without the bad deploy.
	require.NoError(t, inventory.Stop(30*time.Second))
	inventory.Env = slices.DeleteFunc(slices.Clone(inventory.Env), func(kv string) bool { return kv == "BAD_DEPLOY=1" })
	require.NoError(t, inventory.Start())
	require.NoError(t, inventory.WaitReady(ctx))

	// Retry the group: the preview counts it.
	require.NoError(t, chromedp.Do(operator, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.ID("groups")),
		chromedp.Click(chromedp.CSS("#groups tr:nth-child(2) a")), chromedp.WaitVisible(chromedp.ID("bulk-retry"))))
	require.NoError(t, chromedp.Do(operator, chromedp.Click(chromedp.CSS("#bulk-retry button")), chromedp.WaitVisible(chromedp.ID("count"))))
	require.Equal(t, []string{"1000"}, texts(t, operator, "#count"), "the dry run's count")
	browser.Screenshot(t, operator, "console-confirm.png")

	// Hold the 500th message: the action's batch that reaches it waits,
	// its transaction open; then inventory is killed.
	open, err := inboxadmin.New(pool).ListQuarantined(ctx, inboxadmin.QuarantineFilter{Consumer: "inventory", Kind: inbox.KindDeadLetter, Limit: orders})
	require.NoError(t, err)
	require.Len(t, open, orders)
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // rolled back below
	_, err = hold.Exec(ctx, `SELECT 1 FROM inbox_quarantine WHERE id = $1 FOR UPDATE`, open[499].ID)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(operator, chromedp.Click(chromedp.CSS("#confirm button")), chromedp.WaitVisible(chromedp.ID("progress"))))
	awaitCount(t, ctx, "the action waiting for the 500th message", 1, func() int {
		return count(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
	})
	actions, err := inboxadmin.New(pool).ListActions(ctx, inboxadmin.ActionFilter{Running: true})
	require.NoError(t, err)
	require.Len(t, actions, 1)
	action := actions[0]
	inventory.Kill()
	require.NoError(t, hold.Rollback(ctx))
	killed, err := inboxadmin.New(pool).GetAction(ctx, action.ID)
	require.NoError(t, err)
	require.Less(t, killed.Done, int64(500), "killed before the 500th")
	require.Equal(t, inboxadmin.ActionRunning, killed.State)
	t.Logf("inventory killed with action %d at %d of %d", action.ID, killed.Done, killed.Selected)
	require.NoError(t, inventory.Start())
	require.NoError(t, inventory.WaitReady(ctx))

	// The restarted console resumes it.
	awaitCount(t, ctx, "the action finished", orders, func() int {
		a, err := inboxadmin.New(pool).GetAction(ctx, action.ID)
		require.NoError(t, err)
		if a.State != inboxadmin.ActionFinished {
			return int(a.Done) - orders // not yet, however many are done
		}
		return int(a.Done)
	})
	require.NoError(t, chromedp.Do(operator, chromedp.Navigate(fmt.Sprintf("%s/actions/%d", base, action.ID)), chromedp.WaitVisible(chromedp.ID("progress"))))
	require.Equal(t, []string{"finished: 1000 of 1000 done, 0 skipped, 0 refused"}, texts(t, operator, "#progress"))
	require.Zero(t, count(t, ctx, pool, `SELECT count(*) FROM (SELECT message_id FROM outbox_messages WHERE metadata ? 'inbox_redrive_of'
		GROUP BY message_id HAVING count(*) > 1) twice`), "a message written back twice")
	require.Equal(t, orders, count(t, ctx, pool, `SELECT count(DISTINCT message_id) FROM outbox_messages WHERE metadata ? 'inbox_redrive_of'`))

	// Every order settled, nothing applied twice, nothing lost.
	report, err := judge.Wait(ctx, b.sys.Pools["orders"], pool, b.stock, res.Client(), judge.Settled(orders),
		func(r judge.Report) { t.Logf("waiting: %d of %d settled", r.Reserved+r.Rejected, r.OrdersPaid) })
	require.NoError(t, err, "invariants: %+v", report.Invariants)
	require.True(t, report.OK(), "invariants: %+v", report.Invariants)

	// Drop the garbage, with why.
	require.NoError(t, chromedp.Do(operator, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.ID("groups"))))
	require.Equal(t, []string{"3"}, texts(t, operator, "#groups tr td.count"), "only the garbage is left")
	require.NoError(t, chromedp.Do(operator, chromedp.Click(chromedp.CSS("#groups tr:nth-child(2) a")), chromedp.WaitVisible(chromedp.ID("bulk-drop")),
		chromedp.SendKeys(chromedp.CSS("#bulk-drop input[name=why]"), "not an event: a test's garbage"),
		chromedp.Click(chromedp.CSS("#bulk-drop button")), chromedp.WaitVisible(chromedp.ID("count")),
		chromedp.Click(chromedp.CSS("#confirm button")), chromedp.WaitVisible(chromedp.ID("progress"))))
	awaitCount(t, ctx, "the garbage dropped", 0, func() int {
		return count(t, ctx, pool, `SELECT count(*) FROM inbox_quarantine WHERE resolved_at IS NULL`)
	})
	require.NoError(t, chromedp.Do(operator, chromedp.Navigate(base+"/actions"), chromedp.WaitVisible(chromedp.ID("actions"))))
	require.Equal(t, []string{"drop", "retry"}, texts(t, operator, "#actions td.what"), "the history, newest first")
	require.Equal(t, []string{"alice", "alice"}, texts(t, operator, "#actions td.by"))
	browser.Screenshot(t, operator, "console-history.png")
}

// as opens a tab of browser logged in as login ("name:role:secret"), by
// basic auth on every request.
func as(t *testing.T, browser context.Context, login string) context.Context {
	name, rest, _ := strings.Cut(login, ":")
	_, pass, _ := strings.Cut(rest, ":")
	tab, stop := chromedp.NewContext(browser)
	t.Cleanup(stop)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"+pass))
	require.NoError(t, chromedp.Do(tab, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return err
	})))
	return tab
}

func secret(t *testing.T) string {
	b := make([]byte, 18)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)
}

// texts returns the text of every element sel matches.
func texts(t *testing.T, tab context.Context, sel string) []string {
	t.Helper()
	out, err := chromedp.Run(tab, chromedp.Evaluate[[]string](fmt.Sprintf(
		`Array.from(document.querySelectorAll(%q)).map(e => e.textContent.trim())`, sel)))
	require.NoError(t, err)
	return out
}

func countOf(t *testing.T, tab context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(tab, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	require.NoError(t, err)
	return n
}

// count runs a one-number query.
func count(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, sql).Scan(&n), sql)
	return n
}

// awaitCount waits until read returns want, failing only when it has not
// moved for a minute.
func awaitCount(t *testing.T, ctx context.Context, what string, want int, read func() int) {
	t.Helper()
	last, moved := read(), time.Now()
	for n := last; n != want; n = read() {
		if n != last {
			last, moved = n, time.Now()
		}
		if time.Since(moved) > time.Minute || ctx.Err() != nil {
			t.Fatalf("%s: %d, want %d, and nothing moved for a minute", what, n, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the database
	}
}
