package inbox_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/inbox/inboxadmin"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"
)

// poisonTopic is where the dead letters these tests make came from.
const poisonTopic = "payments"

// deadLetters dead-letters n messages of consumer the way the middleware
// leaves them (an inbox row dead_lettered, a quarantine row with the
// payload, the headers and the topic), with the reason reason(i) and the
// headers md, in one statement: a bad deploy's worth in a second. It
// returns their message ids in quarantine id order.
func deadLetters(t testing.TB, ctx context.Context, b *testBundle, n int, reason func(i int) string, md map[string]string) []string {
	t.Helper()
	return keyedDeadLetters(t, ctx, b, n, 0, reason, md)
}

// keyedDeadLetters is deadLetters with the messages spread over keys
// partition keys (none when 0), key-0, key-1, … in turn.
func keyedDeadLetters(t testing.TB, ctx context.Context, b *testBundle, n, keys int, reason func(i int) string, md map[string]string) []string {
	t.Helper()
	ids, reasons := make([]string, n), make([]string, n)
	for i := range n {
		ids[i], reasons[i] = newID(), reason(i)
	}
	if md == nil {
		md = map[string]string{}
	}
	_, err := b.pool.Exec(ctx, `WITH m AS (
			SELECT u.id, u.reason, u.ord FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS u(id, reason, ord)),
		i AS (INSERT INTO inbox_messages (consumer, message_id, payload_sha256, status, topic)
			SELECT $1, id, sha256(convert_to(id, 'UTF8')), 'dead_lettered', $4 FROM m)
		INSERT INTO inbox_quarantine (consumer, message_id, kind, reason, attempts, topic, payload_sha256, payload, metadata)
		SELECT $1, id, 'dead_letter', reason, 5, $4, sha256(convert_to(id, 'UTF8')), convert_to('{"id":"' || id || '"}', 'UTF8'),
			$5::jsonb || CASE WHEN $6 > 0 THEN jsonb_build_object('partition_key', 'key-' || (ord % $6)) ELSE '{}' END
		FROM m ORDER BY ord`, consumer, ids, reasons, poisonTopic, md, keys)
	require.NoError(t, err)
	return ids
}

// badDeploy is the reason a bad deploy gives each message: the same words,
// other ids and numbers.
func badDeploy(i int) string {
	return fmt.Sprintf(`handler: order %s: amount %d.%02d for sku "sku-%d" above the limit 1000 (hash 9f%06xab)`,
		newID(), i, i%100, i, i)
}

// redriven returns the outbox rows the redrives wrote, per message id.
func redriven(t *testing.T, b *testBundle) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT message_id::text, count(*) FROM outbox_messages
		WHERE topic = $1 AND metadata ? $2 GROUP BY message_id`, poisonTopic, inbox.RedriveOfMetadata)
	require.NoError(t, err)
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		counts[id] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

// applyRedriven delivers every redriven outbox row to a handler that now
// works, twice (a relay publishes at least once), and returns how many
// times each message was applied.
func applyRedriven(t *testing.T, b *testBundle, in *inbox.Inbox) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT message_id::text, payload FROM outbox_messages
		WHERE topic = $1 AND metadata ? $2 ORDER BY id`, poisonTopic, inbox.RedriveOfMetadata)
	require.NoError(t, err)
	type msg struct {
		id      string
		payload []byte
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (msg, error) {
		var m msg
		return m, r.Scan(&m.id, &m.payload)
	})
	require.NoError(t, err)
	mw := in.Middleware(b.handler.handle)
	work := make(chan msg)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				if err := deliver(b.ctx, mw, m.id, m.payload); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 2 {
		for _, m := range list {
			work <- m
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	applied := map[string]int{}
	rows, err = b.pool.Query(b.ctx, `SELECT message_id, count(*) FROM applied WHERE consumer = $1 GROUP BY message_id`, consumer)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		applied[id] = n
	}
	require.NoError(t, rows.Err())
	return applied
}

// once is what each of ids counted once looks like.
func once(ids []string) map[string]int {
	m := make(map[string]int, len(ids))
	for _, id := range ids {
		m[id] = 1
	}
	return m
}

// TestFailureGroups: a bad deploy's dead letters, whose reasons differ only
// in the ids, numbers, quoted values and hashes they quote, make one group;
// another reason, another event type, another producer or another kind make
// others.
func TestFailureGroups(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	signed := map[string]string{outbox.TypeMetadata: "PaymentCaptured", "signature_key_id": "payments-2026"}
	deadLetters(t, b.ctx, b, 50, badDeploy, signed)
	deadLetters(t, b.ctx, b, 3, badDeploy, map[string]string{outbox.TypeMetadata: "PaymentRefunded", "signature_key_id": "payments-2026"})
	deadLetters(t, b.ctx, b, 2, badDeploy, map[string]string{outbox.TypeMetadata: "PaymentCaptured", "signature_key_id": "payments-2027"})
	deadLetters(t, b.ctx, b, 4, func(i int) string { return fmt.Sprintf("handler: connection refused after %d tries", i) }, signed)

	groups, err := inboxadmin.New(b.pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	type shape struct {
		Count              int64
		Pattern, Type, Key string
	}
	var got []shape
	for _, g := range groups {
		got = append(got, shape{g.Count, g.ReasonPattern, g.EventType, g.Producer})
		require.Equal(t, inbox.KindDeadLetter, g.Kind)
		require.Equal(t, poisonTopic, g.Topic)
		require.Len(t, g.ID, 16)
		require.False(t, g.LastSeen.Before(g.FirstSeen))
	}
	deploy := `handler: order <id>: amount <n> for sku "…" above the limit <n> (hash <hex>)`
	require.Equal(t, []shape{
		{50, deploy, "PaymentCaptured", "payments-2026"},
		{4, "handler: connection refused after <n> tries", "PaymentCaptured", "payments-2026"},
		{3, deploy, "PaymentRefunded", "payments-2026"},
		{2, deploy, "PaymentCaptured", "payments-2027"},
	}, got)
	require.Contains(t, groups[0].Example, "above the limit 1000", "the example is a reason as it was")

	// A group's messages, a page at a time, without their payloads.
	var pages, seen int
	for after := int64(0); ; pages++ {
		page, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer, Group: groups[0].ID, After: after, Limit: 20, WithoutPayloads: true})
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, q := range page {
			require.True(t, q.Payload == nil && !q.PayloadNull && len(q.PayloadSHA256) == 32, "no payload read, but one there")
			one, err := inboxadmin.New(b.pool).GetQuarantined(b.ctx, q.ID)
			require.NoError(t, err)
			require.NotEmpty(t, one.Payload, "read one at a time")
		}
		seen += len(page)
		after = page[len(page)-1].ID
	}
	require.Equal(t, 50, seen)
	require.Equal(t, 3, pages)

	masked, err := inboxadmin.New(b.pool).ReasonPattern(b.ctx, `key "a\"b" at 0x1f id 0197b0f2-7a1c-7c3e-9d2a-5b7e0c1d2e3f or 01HZY3K9QW7MV2X4N6B8C0D1E2`)
	require.NoError(t, err)
	require.Equal(t, `key "…" at <hex> id <id> or <id>`, masked)
	_, err = inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Group: groups[0].ID})
	require.ErrorContains(t, err, "needs its Consumer", "a group is its consumer's")
}

// TestBulkRetry: a bad deploy's dead letters, fixed, are retried as a group:
// the dry run counts them, the action records who did what to how many, and
// after the relay and the consumer each message is applied once. The same
// group retried again does nothing; a message quarantined after the dry run
// is not part of it; a selection that changed since its dry run is refused.
func TestBulkRetry(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	ids := deadLetters(t, b.ctx, b, 250, badDeploy, nil)
	other := deadLetters(t, b.ctx, b, 5, func(int) string { return "another failure" }, nil)
	groups, err := inboxadmin.New(b.pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, groups, 2)
	group := groups[0].ID

	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Group: group})
	require.NoError(t, err)
	require.EqualValues(t, 250, plan.Count)
	require.Empty(t, redriven(t, b), "a dry run changes nothing")
	late := deadLetters(t, b.ctx, b, 1, badDeploy, nil) // after the dry run: not in it

	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, inboxadmin.Plan{Selection: plan.Selection, Count: 249}, "alice", "")
	require.ErrorIs(t, err, inboxadmin.ErrSelectionChanged, "a count other than the selection's")
	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "", "")
	require.Error(t, err, "who does it")
	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionDrop, plan, "alice", " ")
	require.Error(t, err, "a drop without why")
	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Empty(t, history, "refused actions record nothing")

	action, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "fixed in v1.4.2")
	require.NoError(t, err)
	var progress []int64
	done, err := inboxadmin.New(b.pool).RunBulk(b.ctx, action.ID, inboxadmin.BulkOptions{BatchSize: 40, Progress: func(a inboxadmin.Action) {
		progress = append(progress, a.Done)
	}})

	require.NoError(t, err)
	require.Equal(t, []int64{40, 80, 120, 160, 200, 240, 250, 250}, progress, "progress after each batch, and at the end")
	require.Equal(t, inboxadmin.ActionFinished, done.State)
	require.EqualValues(t, 250, done.Done)
	require.Zero(t, done.Skipped+done.Refused+done.Remaining())
	require.Equal(t, once(ids), redriven(t, b), "each message written back once")

	// Again, as a second operator who missed the first: nothing left.
	again, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Group: group, UpTo: plan.Selection.UpTo})
	require.NoError(t, err)
	require.Zero(t, again.Count)
	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, again, "bob", "")
	require.ErrorIs(t, err, inboxadmin.ErrNothingSelected)
	// The same action run again does nothing more.
	rerun, err := inboxadmin.New(b.pool).RunBulk(b.ctx, action.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, done.Done, rerun.Done)

	b.handler.hook = nil
	applied := applyRedriven(t, b, in)
	require.Equal(t, once(ids), applied, "each message applied once, though delivered twice")

	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	var left []string
	for _, q := range open {
		left = append(left, q.MessageID)
	}
	require.ElementsMatch(t, append(other, late...), left, "the other group and the late message stay open")

	history, err = inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 1)
	h := history[0]
	require.Equal(t, [4]string{inboxadmin.ActionRetry, "alice", "fixed in v1.4.2", group}, [4]string{h.Action, h.Actor, h.Why, h.Selection.Group})
	require.EqualValues(t, 250, h.Selected)
	require.NotNil(t, h.FinishedAt)
	items, err := inboxadmin.New(b.pool).ListActionItems(b.ctx, h.ID, 0, 1000)
	require.NoError(t, err)
	require.Len(t, items, 250)
	for _, it := range items {
		require.Equal(t, inboxadmin.OutcomeDone, it.Outcome)
	}
}

// TestBulkActionsOverlap: two operators retry the same group at once, each
// with an action of their own: each message is written back once, the
// other action counting it skipped. A drop of the same group beside them
// discards only what neither retried.
func TestBulkActionsOverlap(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	ids := keyedDeadLetters(t, b.ctx, b, 300, 13, badDeploy, nil)
	// Each operator's own dry run, of the same messages.
	start := func(action, who, why string) inboxadmin.Action {
		plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
		require.NoError(t, err)
		a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, action, plan, who, why)
		require.NoError(t, err)
		return a
	}
	actions := []inboxadmin.Action{start(inboxadmin.ActionRetry, "alice", ""), start(inboxadmin.ActionRetry, "bob", ""), start(inboxadmin.ActionDrop, "carol", "stale")}

	results := runAll(t, b, actions, 7)
	var done int64
	for _, r := range results {
		require.EqualValues(t, 300, r.Done+r.Skipped, "action %d", r.ID)
		done += r.Done
	}
	require.EqualValues(t, 300, done, "each message done by one action")
	retried := redriven(t, b)
	for id, n := range retried {
		require.Equal(t, 1, n, "message %s written back %d times", id, n)
	}
	require.EqualValues(t, results[0].Done+results[1].Done, len(retried))
	require.EqualValues(t, results[2].Done, 300-len(retried))
	require.Len(t, ids, 300)
}

// runAll runs actions at once, batch messages a transaction, and fails the
// test on any error.
func runAll(t *testing.T, b *testBundle, actions []inboxadmin.Action, batch int) []inboxadmin.Action {
	t.Helper()
	results := make([]inboxadmin.Action, len(actions))
	errs := make([]error, len(actions))
	var wg sync.WaitGroup
	for i, a := range actions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = inboxadmin.New(b.pool).RunBulk(b.ctx, a.ID, inboxadmin.BulkOptions{BatchSize: batch})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return results
}

// TestBulkRetriesOfTwoGroupsAtOnce: two groups whose messages share their
// partition keys, retried at once: each batch locks its keys (the outbox
// numbers each key's messages) in its own order, so the two deadlock now
// and then; the batch Postgres undoes is done again, and both finish,
// each message written back once.
func TestBulkRetriesOfTwoGroupsAtOnce(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	ids := keyedDeadLetters(t, b.ctx, b, 600, 17, func(i int) string {
		if i%2 == 0 {
			return badDeploy(i)
		}
		return fmt.Sprintf("timeout after %dms", i)
	}, nil)
	groups, err := inboxadmin.New(b.pool).ListGroups(b.ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, groups, 2)
	var actions []inboxadmin.Action
	for _, g := range groups {
		plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Group: g.ID})
		require.NoError(t, err)
		a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
		require.NoError(t, err)
		actions = append(actions, a)
	}
	for _, r := range runAll(t, b, actions, 50) {
		require.EqualValues(t, [2]int64{300, 0}, [2]int64{r.Done, r.Skipped + r.Refused})
	}
	require.Equal(t, once(ids), redriven(t, b))
}

// TestBulkRetryRefusesWhatCannotBeWrittenBack: a dead letter whose record,
// with the redrive's headers, is over the outbox's limit is refused with
// the reason, whatever the redrive wrote of it undone, and the action goes
// on with the others.
func TestBulkRetryRefusesWhatCannotBeWrittenBack(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	ids := deadLetters(t, b.ctx, b, 3, badDeploy, nil)
	_, err := b.pool.Exec(b.ctx, `UPDATE inbox_quarantine SET payload = convert_to(repeat('x', $2), 'UTF8') WHERE message_id = $1`,
		ids[1], outbox.DefaultMaxMessageBytes-50)
	require.NoError(t, err)
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)
	a, err = inboxadmin.New(b.pool).RunBulk(b.ctx, a.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.EqualValues(t, [3]int64{2, 0, 1}, [3]int64{a.Done, a.Skipped, a.Refused})
	items, err := inboxadmin.New(b.pool).ListActionItems(b.ctx, a.ID, 0, 0)
	require.NoError(t, err)
	require.Contains(t, items[1].Note, "too large")
	require.Equal(t, once([]string{ids[0], ids[2]}), redriven(t, b))
	require.Equal(t, "dead_lettered", scalar[string](t, b, `SELECT status FROM inbox_messages WHERE message_id = $1`, ids[1]),
		"the refused redrive's writes undone")
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, open, 1, "still open, to be dropped")
}

// TestBulkRetryRefusesWhatCannotBeRetried: a group of payload conflicts
// cannot be retried (it would only conflict again): each is refused with
// the reason, the action finishes, and the same group is dropped instead.
func TestBulkRetryRefusesWhatCannotBeRetried(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	mw := in.Middleware(b.handler.handle)
	for range 3 {
		id := newID()
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"amount":1}`)))
		require.NoError(t, deliver(b.ctx, mw, id, []byte(`{"amount":2}`)))
	}
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Kind: inbox.KindPayloadConflict})
	require.NoError(t, err)
	require.EqualValues(t, 3, plan.Count)
	a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)
	a, err = inboxadmin.New(b.pool).RunBulk(b.ctx, a.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.EqualValues(t, [3]int64{0, 0, 3}, [3]int64{a.Done, a.Skipped, a.Refused})
	items, err := inboxadmin.New(b.pool).ListActionItems(b.ctx, a.ID, 0, 0)
	require.NoError(t, err)
	require.Contains(t, items[0].Note, "discard it instead")

	plan, err = inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer, Kind: inbox.KindPayloadConflict})
	require.NoError(t, err)
	require.EqualValues(t, 3, plan.Count, "refused: still open")
	d, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionDrop, plan, "alice", "the producer resent other amounts; settled by hand")
	require.NoError(t, err)
	d, err = inboxadmin.New(b.pool).RunBulk(b.ctx, d.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 3, d.Done)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Empty(t, open)
}

// TestSingleActionsAreInTheHistory: inboxadmin.Admin.Retry and inboxadmin.Admin.Drop
// record an action of one message each, in the history bulk actions are in.
func TestSingleActionsAreInTheHistory(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	deadLetters(t, b.ctx, b, 2, badDeploy, nil)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	res, err := inboxadmin.New(b.pool).Retry(b.ctx, open[0].ID, "alice")
	require.NoError(t, err)
	require.True(t, res.Redriven)
	_, err = inboxadmin.New(b.pool).Retry(b.ctx, open[0].ID, "alice") // resolved: nothing done, nothing recorded
	require.NoError(t, err)
	_, err = inboxadmin.New(b.pool).Drop(b.ctx, open[1].ID, "bob", "duplicate of a manual fix")
	require.NoError(t, err)

	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 2)
	type entry struct {
		Action, Actor, Why string
		IDs                []int64
		Done               int64
		State              string
	}
	var got []entry
	for _, h := range history {
		got = append(got, entry{h.Action, h.Actor, h.Why, h.Selection.IDs, h.Done, h.State})
	}
	require.Equal(t, []entry{
		{inboxadmin.ActionDrop, "bob", "duplicate of a manual fix", []int64{open[1].ID}, 1, inboxadmin.ActionFinished},
		{inboxadmin.ActionRetry, "alice", "", []int64{open[0].ID}, 1, inboxadmin.ActionFinished},
	}, got, "newest first")
}

// TestBulkRetryResumesAfterAKill: a process running a bulk retry is killed
// with SIGKILL with a batch open: its first batch committed, the second
// half done in a transaction that never commits. Run again, the action
// goes on where it stopped: each message written back once, counted done
// once by the action, and applied once.
func TestBulkRetryResumesAfterAKill(t *testing.T) {
	if id := os.Getenv("INBOX_BULK_CHILD"); id != "" {
		// The child: run the action, print a line after each batch.
		action, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		ctx := context.Background()
		pool, err := pgxpool.New(ctx, os.Getenv("INBOX_BULK_DB"))
		require.NoError(t, err)
		_, err = inboxadmin.New(pool).RunBulk(ctx, action, inboxadmin.BulkOptions{BatchSize: 10, Progress: func(a inboxadmin.Action) {
			fmt.Printf("progress %d\n", a.Done)
		}})

		require.NoError(t, err)
		return
	}
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	ids := deadLetters(t, b.ctx, b, 35, badDeploy, nil)
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	action, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)

	// Hold the 15th message's quarantine row: the child's second batch does
	// the 11th to the 14th and waits for it, its transaction open.
	hold, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.WithoutCancel(b.ctx)) //nolint:errcheck // rolled back below
	_, err = hold.Exec(b.ctx, `SELECT 1 FROM inbox_quarantine WHERE message_id = $1 FOR UPDATE`, ids[14])
	require.NoError(t, err)

	child := exec.Command(os.Args[0], "-test.run=^TestBulkRetryResumesAfterAKill$")
	child.Env = append(os.Environ(), "INBOX_BULK_CHILD="+strconv.FormatInt(action.ID, 10), "INBOX_BULK_DB="+b.pool.Config().ConnString())
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	child.Stderr = os.Stderr
	require.NoError(t, child.Start())
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the child's first batch")
	require.Equal(t, "progress 10", lines.Text())
	awaitLockWaiters(t, b, 1, "the child's second batch waiting for the 15th message")
	for i, id := range ids[10:14] { // done in the child's open transaction: their rows locked by it
		_, err := b.pool.Exec(b.ctx, `SELECT 1 FROM inbox_quarantine WHERE message_id = $1 FOR UPDATE NOWAIT`, id)
		require.ErrorContains(t, err, "could not obtain lock", "message %d", 11+i)
	}
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	err = child.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the child ended with %v", err)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
	require.NoError(t, hold.Rollback(b.ctx))

	killed, err := inboxadmin.New(b.pool).GetAction(b.ctx, action.ID)
	require.NoError(t, err)
	require.Equal(t, [2]any{inboxadmin.ActionRunning, int64(10)}, [2]any{killed.State, killed.Done}, "the first batch, and only it")
	require.Len(t, redriven(t, b), 10, "the open batch's work went with its transaction")
	running, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer, Running: true})
	require.NoError(t, err)
	require.Len(t, running, 1, "what is left to resume")

	resumed, err := inboxadmin.New(b.pool).RunBulk(b.ctx, action.ID, inboxadmin.BulkOptions{BatchSize: 10})
	require.NoError(t, err)
	require.EqualValues(t, [4]int64{35, 0, 0, 0}, [4]int64{resumed.Done, resumed.Skipped, resumed.Refused, resumed.Remaining()})
	require.Equal(t, once(ids), redriven(t, b))
	require.Equal(t, once(ids), applyRedriven(t, b, in))
}

// TestBulkRetryOfTenThousand: a bad deploy's 10,000 dead letters, retried
// as one group, with progress after each batch: each written back once and,
// delivered twice, applied once.
func TestBulkRetryOfTenThousand(t *testing.T) {
	t.Parallel()
	in, b := setup(t, inbox.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ctx = ctx
	ids := deadLetters(t, ctx, b, 10000, badDeploy, nil)
	groups, err := inboxadmin.New(b.pool).ListGroups(ctx, inboxadmin.GroupFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, groups, 1)
	plan, err := inboxadmin.New(b.pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Group: groups[0].ID})
	require.NoError(t, err)
	require.EqualValues(t, 10000, plan.Count)
	a, err := inboxadmin.New(b.pool).StartBulk(ctx, inboxadmin.ActionRetry, plan, "alice", "fixed in v1.4.3")
	require.NoError(t, err)
	var progress []int64
	a, err = inboxadmin.New(b.pool).RunBulk(ctx, a.ID, inboxadmin.BulkOptions{BatchSize: 500, Progress: func(a inboxadmin.Action) {
		progress = append(progress, a.Done)
	}})

	require.NoError(t, err)
	require.Len(t, progress, 21, "twenty batches, and the end")
	for i, done := range progress[:20] {
		require.EqualValues(t, 500*(i+1), done)
	}
	require.EqualValues(t, [3]int64{10000, 0, 0}, [3]int64{a.Done, a.Skipped, a.Refused})
	require.Equal(t, once(ids), redriven(t, b))
	require.Equal(t, once(ids), applyRedriven(t, b, in))
}

// TestBulkRefusesAChangedSelection: between the dry run and the start,
// another operator dropped one of the messages counted: the start is
// refused, and records nothing; a new dry run counts what is left.
func TestBulkRefusesAChangedSelection(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	deadLetters(t, b.ctx, b, 5, badDeploy, nil)
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	open, err := inboxadmin.New(b.pool).ListQuarantined(b.ctx, inboxadmin.QuarantineFilter{Consumer: consumer})
	require.NoError(t, err)
	_, err = inboxadmin.New(b.pool).Drop(b.ctx, open[2].ID, "bob", "a test order")
	require.NoError(t, err)

	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.ErrorIs(t, err, inboxadmin.ErrSelectionChanged)
	require.ErrorContains(t, err, "it holds 4 open messages, 5 when counted")
	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 1, "bob's drop only")
	again, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	require.EqualValues(t, 4, again.Count)
}

// TestStopBulk: an operator stops an action between its batches: RunBulk
// returns it stopped, with what it did; run again, it does nothing more;
// the messages it did not reach stay open, for a new dry run.
func TestStopBulk(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	deadLetters(t, b.ctx, b, 250, badDeploy, nil)
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)
	_, err = inboxadmin.New(b.pool).StopBulk(b.ctx, a.ID, "")
	require.Error(t, err, "who stops it")
	stopped, err := inboxadmin.New(b.pool).RunBulk(b.ctx, a.ID, inboxadmin.BulkOptions{BatchSize: 50, Progress: func(a inboxadmin.Action) {
		if a.Done == 50 {
			_, err := inboxadmin.New(b.pool).StopBulk(b.ctx, a.ID, "bob")
			require.NoError(t, err)
		}
	}})

	require.NoError(t, err)
	require.Equal(t, [3]any{inboxadmin.ActionStopped, "bob", int64(50)}, [3]any{stopped.State, stopped.StoppedBy, stopped.Done})
	require.NotNil(t, stopped.FinishedAt)
	again, err := inboxadmin.New(b.pool).RunBulk(b.ctx, a.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 50, again.Done, "a stopped action does nothing more")
	left, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	require.EqualValues(t, 200, left.Count)
	running, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Running: true})
	require.NoError(t, err)
	require.Empty(t, running)
	finished, err := inboxadmin.New(b.pool).StopBulk(b.ctx, a.ID, "carol")
	require.NoError(t, err)
	require.Equal(t, "bob", finished.StoppedBy, "stopped once")
}

// TestBulkOnParkedRows: the parked rows of the outbox in the consumer's
// database in bulk (Selection.Parked): a dry run counts a topic's, a retry
// unparks each once and leaves the other topic's, a drop moves the rest to
// outbox_dropped with who and why; both are in the history. A row retried
// meanwhile by hand is skipped.
func TestBulkOnParkedRows(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, b := setup(t, inbox.Config{})
	park := func(topic string) int64 {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, topic, outbox.NewMessage("k-"+topic, []byte("too large for the broker")))
		}))
		return scalar[int64](t, b, `UPDATE outbox_messages SET parked_at = now(), park_reason = 'record too large'
			WHERE id = (SELECT max(id) FROM outbox_messages) RETURNING id`)
	}
	a1, a2, a3, other := park("a"), park("a"), park("a"), park("b")
	_, err := inboxadmin.New(b.pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Parked: true, Kind: inbox.KindDeadLetter})
	require.Error(t, err, "a kind is not a parked row's")

	plan, err := inboxadmin.New(b.pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Parked: true, Topic: "a"})
	require.NoError(t, err)
	require.Equal(t, int64(3), plan.Count)
	require.NoError(t, outboxadmin.New(b.pool).Retry(ctx, a2)) // by hand, meanwhile
	_, err = inboxadmin.New(b.pool).StartBulk(ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.ErrorIs(t, err, inboxadmin.ErrSelectionChanged)
	plan, err = inboxadmin.New(b.pool).DryRun(ctx, plan.Selection) // looked again
	require.NoError(t, err)
	require.Equal(t, int64(2), plan.Count)
	started, err := inboxadmin.New(b.pool).StartBulk(ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)
	done, err := inboxadmin.New(b.pool).RunBulk(ctx, started.ID, inboxadmin.BulkOptions{BatchSize: 1})
	require.NoError(t, err)
	require.Equal(t, [2]int64{2, 0}, [2]int64{done.Done, done.Skipped})
	parked := func(id int64) bool {
		return scalar[bool](t, b, `SELECT parked_at IS NOT NULL FROM outbox_messages WHERE id = $1`, id)
	}
	require.False(t, parked(a1))
	require.False(t, parked(a3))
	require.True(t, parked(other), "another topic's row is not chosen")

	plan, err = inboxadmin.New(b.pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Parked: true})
	require.NoError(t, err)
	require.Equal(t, int64(1), plan.Count)
	started, err = inboxadmin.New(b.pool).StartBulk(ctx, inboxadmin.ActionDrop, plan, "bob", "the consumer reads it from the archive")
	require.NoError(t, err)
	_, err = inboxadmin.New(b.pool).RunBulk(ctx, started.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, "bob: the consumer reads it from the archive", scalar[string](t, b,
		`SELECT dropped_by || ': ' || drop_reason FROM outbox_dropped WHERE id = $1`, other))
	history, err := inboxadmin.New(b.pool).ListActions(ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 2)
	require.True(t, history[0].Selection.Parked && history[1].Selection.Parked)
}

// TestBulkRefusesOtherRowsOfTheSameCount: a selection that holds as many
// rows as its dry run counted, but not the same (one unparked by hand, one
// parked by the relay meanwhile), is refused; the dry run's digest tells
// them apart.
func TestBulkRefusesOtherRowsOfTheSameCount(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, b := setup(t, inbox.Config{})
	var ids []int64
	for range 3 {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, tx, "a", outbox.NewMessage("k", []byte("too large for the broker")))
		}))
		ids = append(ids, scalar[int64](t, b, `SELECT max(id) FROM outbox_messages`))
	}
	park := func(id int64) {
		t.Helper()
		_, err := b.pool.Exec(ctx, `UPDATE outbox_messages SET parked_at = now(), park_reason = 'record too large' WHERE id = $1`, id)
		require.NoError(t, err)
	}
	park(ids[0])
	park(ids[2])
	plan, err := inboxadmin.New(b.pool).DryRun(ctx, inboxadmin.Selection{Consumer: consumer, Parked: true})
	require.NoError(t, err)
	require.Equal(t, int64(2), plan.Count)
	require.NoError(t, outboxadmin.New(b.pool).Retry(ctx, ids[0]))
	park(ids[1]) // below the dry run's UpTo

	_, err = inboxadmin.New(b.pool).StartBulk(ctx, inboxadmin.ActionDrop, plan, "alice", "too large")
	require.ErrorIs(t, err, inboxadmin.ErrSelectionChanged)
	require.ErrorContains(t, err, "not the same")
	history, err := inboxadmin.New(b.pool).ListActions(ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Empty(t, history, "nothing recorded")
}

// TestBulkStartedTwiceIsOneAction: a dry run is started once: its plan
// started again (a confirmation sent twice, at once, or after its action
// stopped or finished) is the action the first start recorded; by another
// operator it is refused; a new dry run of the same rows is a new action.
func TestBulkStartedTwiceIsOneAction(t *testing.T) {
	t.Parallel()
	_, b := setup(t, inbox.Config{})
	deadLetters(t, b.ctx, b, 5, badDeploy, nil)
	plan, err := inboxadmin.New(b.pool).DryRun(b.ctx, inboxadmin.Selection{Consumer: consumer})
	require.NoError(t, err)
	const clicks = 4
	ids := make(chan int64, clicks)
	var g errgroup.Group
	for range clicks {
		g.Go(func() error {
			a, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
			ids <- a.ID
			return err
		})
	}
	require.NoError(t, g.Wait())
	close(ids)
	first := <-ids
	for id := range ids {
		require.Equal(t, first, id, "one action")
	}
	_, err = inboxadmin.New(b.pool).StopBulk(b.ctx, first, "alice")
	require.NoError(t, err)
	again, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.NoError(t, err)
	require.Equal(t, [2]any{first, inboxadmin.ActionStopped}, [2]any{again.ID, again.State}, "started once, stopped since")

	plan, err = inboxadmin.New(b.pool).DryRun(b.ctx, plan.Selection) // the same rows, looked at again
	require.NoError(t, err)
	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "bob", "")
	require.NoError(t, err, "bob's first start of it")
	_, err = inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "alice", "")
	require.ErrorIs(t, err, inboxadmin.ErrPlanStarted, "alice confirms what bob started")
	second, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "bob", "")
	require.NoError(t, err)
	require.NotEqual(t, first, second.ID, "a new dry run")
	finished, err := inboxadmin.New(b.pool).RunBulk(b.ctx, second.ID, inboxadmin.BulkOptions{})
	require.NoError(t, err)
	require.EqualValues(t, 5, finished.Done)
	late, err := inboxadmin.New(b.pool).StartBulk(b.ctx, inboxadmin.ActionRetry, plan, "bob", "")
	require.NoError(t, err, "a confirmation that comes after its action finished")
	require.Equal(t, [2]any{second.ID, inboxadmin.ActionFinished}, [2]any{late.ID, late.State})
	history, err := inboxadmin.New(b.pool).ListActions(b.ctx, inboxadmin.ActionFilter{Consumer: consumer})
	require.NoError(t, err)
	require.Len(t, history, 2)
}
