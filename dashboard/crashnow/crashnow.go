// Package crashnow is the live demo's "crash it now": a five-minute lesson on
// the crash windows. It arms one window in a running service for its next
// hit (POST /debug/crash, served only by a failpoint build), pays an order so
// a message meets the window, and tells what follows, one sentence a step:
// the SIGKILL, the restart, the redelivery Kafka makes, and what the inbox
// does with it (a suppressed duplicate after a commit; a first application
// after a rollback). Every step is read, not assumed: the kill and the
// redelivery from the failpoint log (FAILPOINT_LOG, with FAILPOINT_TRACE
// naming before-begin, so each delivery leaves a line), the outcome from the
// databases.
//
// The demo turns it on once its own check has passed (cmd/demo -keep), and
// the page (dashboard) shows it; chaos -scenario tells the same
// windows in a terminal, from the same stories (chaos/judge Windows).
package crashnow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/provider"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/dashboard"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/services/events"
)

// order is the order in which the page offers the windows: the four
// consumer windows first, the lesson's core, then the relay's and the API's.
var order = []failpoint.Name{
	failpoint.BeforeBegin, failpoint.AfterInboxInsert, failpoint.AfterHandlerBeforeCommit, failpoint.AfterCommitBeforeAck,
	failpoint.AfterClaimBeforePublish, failpoint.AfterPublishBeforeMark, failpoint.AfterCommitBeforeResponse,
	failpoint.BeforeEffect, failpoint.AfterEffectBeforeRecord,
}

// SKU is the item the lessons' orders buy; New stocks it.
const SKU = "lesson-sku"

// Lab runs lessons on a started system. It implements dashboard.Crasher.
type Lab struct {
	sys     *system.System
	fpLog   string
	timeout time.Duration
	ctx     context.Context

	mu      sync.Mutex
	enabled bool
	lesson  *dashboard.Lesson
	running bool
	wg      sync.WaitGroup // the lesson running
}

// Wait waits for a running lesson to end (its ctx ending ends it).
func (l *Lab) Wait() { l.wg.Wait() }

// New returns a Lab that offers nothing until Enable. fpLog is the
// services' FAILPOINT_LOG; they must trace before-begin (Env). Lessons run
// until ctx ends.
func New(ctx context.Context, sys *system.System, fpLog string) *Lab {
	return &Lab{sys: sys, fpLog: fpLog, timeout: 45 * time.Second, ctx: ctx}
}

// Enable stocks the lessons' SKU and offers the windows: the demo calls it
// once its own check is done, so lessons never mix with what it checks.
func (l *Lab) Enable(ctx context.Context) error {
	if err := l.sys.Client.SeedStock(ctx, map[string]int{SKU: 100_000}); err != nil {
		return fmt.Errorf("stocking %s: %w", SKU, err)
	}
	l.mu.Lock()
	l.enabled = true
	l.mu.Unlock()
	return nil
}

// Busy reports whether a lesson runs: a load generator should hold back,
// so the lesson's own order is the one that meets the window.
func (l *Lab) Busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running
}

// Prepare sets up opts for a system with a Lab: the services get a
// failpoint log and a trace line at every delivery, and rejoin their Kafka
// consumer group within seconds of a restart (a 2s session timeout, which
// the embedded broker is told to allow), so a lesson takes seconds, not the
// default ten. Published rows stay the relay's retention (15 days), so the
// page's outbox counts do not shrink under a learner.
func Prepare(opts *system.Options, fpLog string) {
	opts.Env = append(opts.Env, "FAILPOINT_LOG="+fpLog, "FAILPOINT_TRACE="+string(failpoint.BeforeBegin),
		"KAFKA_SESSION_TIMEOUT=2s", "KAFKA_REBALANCE_TIMEOUT=3s", "EFFECT_LEASE=3s")
	opts.Kafka.MinSessionTimeout = 500 * time.Millisecond
}

// Windows implements dashboard.Crasher.
func (l *Lab) Windows() []dashboard.CrashWindow {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled {
		return nil
	}
	var out []dashboard.CrashWindow
	for _, n := range order {
		sc := judge.Windows[n]
		out = append(out, dashboard.CrashWindow{Name: string(n), Victim: sc.Victim, Where: "At that moment " + sc.Before})
	}
	return out
}

// Lesson implements dashboard.Crasher: a copy of the latest lesson.
func (l *Lab) Lesson() *dashboard.Lesson {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lesson == nil {
		return nil
	}
	c := *l.lesson
	c.Steps = append([]dashboard.LessonStep(nil), l.lesson.Steps...)
	return &c
}

// Crash implements dashboard.Crasher: it starts a lesson at window and
// returns; the lesson's steps appear as they happen.
func (l *Lab) Crash(window string) error {
	w := failpoint.Name(window)
	sc, ok := judge.Windows[w]
	if !ok {
		return fmt.Errorf("unknown crash window %q", window)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled {
		return errors.New("crash lessons start once the demo's check is done")
	}
	if l.running {
		return dashboard.ErrLessonRunning
	}
	id := 1
	if l.lesson != nil {
		id = l.lesson.ID + 1
	}
	l.running = true
	l.lesson = &dashboard.Lesson{ID: id, Window: window, Victim: sc.Victim}
	l.wg.Add(1)
	go l.run(w, sc)
	return nil
}

// step adds one sentence to the running lesson.
func (l *Lab) step(kind, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lesson.Steps = append(l.lesson.Steps, dashboard.LessonStep{At: time.Now(), Kind: kind, Text: fmt.Sprintf(format, args...)})
}

func (l *Lab) set(f func(*dashboard.Lesson)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l.lesson)
}

func (l *Lab) run(w failpoint.Name, sc judge.Window) {
	defer l.wg.Done()
	ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
	defer cancel()
	err := l.teach(ctx, w, sc)
	if err != nil {
		l.recover(w, sc)
	}
	l.set(func(les *dashboard.Lesson) {
		les.Done = true
		if err != nil {
			les.Failed = err.Error()
		}
	})
	l.mu.Lock()
	l.running = false
	l.mu.Unlock()
}

// recover leaves the system serving after a lesson that failed: a victim
// that was killed is started again, one still armed is disarmed, so no later
// message meets the window.
func (l *Lab) recover(w failpoint.Name, sc judge.Window) {
	if l.ctx.Err() != nil {
		return // shutting down: nothing is started again
	}
	ctx, cancel := context.WithTimeout(l.ctx, 30*time.Second)
	defer cancel()
	victim := l.sys.Procs[sc.Victim][0]
	select {
	case <-victim.Exited():
		if err := victim.Start(); err == nil {
			victim.WaitReady(ctx) //nolint:errcheck // best effort; the page shows the lesson's error
		}
	default:
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+victim.Addr+"/debug/crash?window="+string(w), nil)
		if err == nil {
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
			}
		}
	}
}

// teach is one lesson: arm, pay, kill, restart, redeliver, outcome, settled.
func (l *Lab) teach(ctx context.Context, w failpoint.Name, sc judge.Window) error {
	victim := l.sys.Procs[sc.Victim][0]
	mark := logSize(l.fpLog)
	armedPid := victim.Pid()
	if err := arm(ctx, victim.Addr, w); err != nil {
		return err
	}
	l.step("armed", "%s (pid %d) is armed: at its next hit of %s it kills itself with SIGKILL.", sc.Victim, victim.Pid(), w)

	order, err := l.sys.Client.CreateOrder(ctx, []events.Line{{SKU: SKU, Quantity: 1}})
	if err != nil {
		return fmt.Errorf("creating an order: %w", err)
	}
	l.set(func(les *dashboard.Lesson) { les.Order = order.ID })
	paid := make(chan error, 1)
	go func() {
		_, err := l.sys.Client.Pay(ctx, order.ID) // retries until some incarnation answers
		paid <- err
	}()
	l.step("paid", "Paying order %s: orders commits status paid and its OrderPaid outbox row in one transaction.", order.ID)

	select {
	case <-victim.Exited():
	case <-ctx.Done():
		return fmt.Errorf("%s was not killed within %s: the window was not reached", sc.Victim, l.timeout)
	}
	kill, ok := findKill(l.fpLog, mark, w, armedPid)
	if !ok {
		return fmt.Errorf("%s (pid %d) exited, but the failpoint log %s has no line of its kill in %s", sc.Victim, armedPid, l.fpLog, w)
	}
	subject := kill.subject
	// Another order may have met the window first: follow the one killed.
	followed := order.ID
	switch {
	case w == failpoint.AfterCommitBeforeResponse:
		followed = subject
	case strings.HasPrefix(subject, events.CaptureKeyPrefix):
		followed = events.CaptureOrder(subject)
	default:
		var key string
		if err := l.sys.Pools["orders"].QueryRow(ctx, `SELECT partition_key FROM outbox_messages WHERE message_id::text = $1`, subject).Scan(&key); err == nil {
			followed = key
		}
	}
	l.set(func(les *dashboard.Lesson) { les.Message, les.Order = subject, followed })
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: the victim is not started again
	}
	l.step("killed", "%s (pid %d) was killed with SIGKILL in %s while working on %s. At that moment %s", sc.Victim, kill.pid, w, subject, sc.Before)

	if err := victim.Start(); err != nil {
		return fmt.Errorf("restarting %s: %w", sc.Victim, err)
	}
	if err := victim.WaitReady(ctx); err != nil {
		return fmt.Errorf("restarting %s: %w", sc.Victim, err)
	}
	l.step("restarted", "The demo restarted %s (pid %d), as an orchestrator would: it rejoins its Kafka consumer group.", sc.Victim, victim.Pid())

	switch w {
	case failpoint.BeforeEffect, failpoint.AfterEffectBeforeRecord:
		if err := <-paid; err != nil {
			return fmt.Errorf("paying: %w", err)
		}
		c, err := l.captureOutcome(ctx, followed)
		if err != nil {
			return err
		}
		if w == failpoint.AfterEffectBeforeRecord {
			l.step("retried", "After its lease, orders called the provider again with Idempotency-Key %s: the provider answered with the stored response %d time%s (Idempotent-Replayed: true) and did not capture again. Its ledger holds %d capture for the order; the order is %s (%s).",
				subject, c.replays, map[bool]string{true: "", false: "s"}[c.replays == 1], c.ledger, c.payment, w)
		} else {
			l.step("retried", "After its lease, orders called the provider with Idempotency-Key %s, and the provider captured it: %d capture in its ledger; the order is %s (%s).",
				subject, c.ledger, c.payment, w)
		}
	case failpoint.AfterCommitBeforeResponse:
		if err := <-paid; err != nil {
			return fmt.Errorf("paying: %w", err)
		}
		var rows int
		if err := l.sys.Pools["orders"].QueryRow(ctx, `SELECT count(*) FROM outbox_messages WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3`,
			events.TopicOrders, followed, events.TypeOrderPaid).Scan(&rows); err != nil {
			return err
		}
		l.step("retried", "The client had no answer and paid again: the order was already paid, so nothing changed: %d OrderPaid row%s in orders' outbox (%s).",
			rows, map[bool]string{true: "", false: "s"}[rows == 1], w)
	default:
		msgID := subject
		// A relay window's copy reaches inventory as it always does; a
		// consumer window's comes back once Kafka hands the partition to
		// the restarted process.
		since := mark
		copies := 1
		if w == failpoint.AfterPublishBeforeMark {
			copies = 2 // the first one before the kill, or just after it
		} else if sc.Victim == "inventory" {
			since = kill.end
		}
		// A consumer window's copy must reach the restarted process.
		pid := 0
		if sc.Victim == "inventory" {
			pid = victim.Pid()
		}
		if err := waitFor(ctx, func() (bool, error) { return deliveries(l.fpLog, since, msgID, pid) >= copies, nil }); err != nil {
			return fmt.Errorf("waiting for %s to reach inventory again (is it a message of orders' outbox?): %w", msgID, err)
		}
		switch {
		case sc.Victim == "inventory":
			l.step("redelivered", "Kafka delivered %s again, to the restarted inventory (pid %d): its offset had never been committed (%s).", msgID, pid, w)
		case w == failpoint.AfterPublishBeforeMark:
			l.step("redelivered", "The restarted relay found %s unmarked and published it again: Kafka holds two copies, and inventory received both (%s).", msgID, w)
		default:
			l.step("redelivered", "The restarted relay claimed %s again and published it: inventory received it (%s).", msgID, w)
		}
		if err := l.outcome(ctx, w, msgID, followed); err != nil {
			return err
		}
		if err := <-paid; err != nil {
			return fmt.Errorf("paying: %w", err)
		}
	}

	var status string
	err = waitFor(ctx, func() (bool, error) {
		err := l.sys.Pools["orders"].QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, followed).Scan(&status)
		return status == "reserved" || status == "rejected", err
	})
	if err != nil {
		return fmt.Errorf("order %s did not settle (status %q): %w", followed, status, err)
	}
	l.step("settled", "Order %s is %s at orders, its answer applied once. Why nothing was applied twice: %s", followed, status, sc.Why)
	return nil
}

// capture is what became of an order's capture.
type capture struct {
	payment string // the order's payment state
	ledger  int    // attempts in the provider's ledger
	replays int    // calls the provider answered with the stored response
}

// captureOutcome waits for orders to record the order's capture and reads
// the provider's ledger and log.
func (l *Lab) captureOutcome(ctx context.Context, orderID string) (capture, error) {
	var c capture
	err := waitFor(ctx, func() (bool, error) {
		err := l.sys.Pools["orders"].QueryRow(ctx, `SELECT coalesce(payment, '') FROM orders WHERE id = $1`, orderID).Scan(&c.payment)
		return c.payment != "" && c.payment != "capturing", err
	})
	if err != nil {
		return c, fmt.Errorf("the capture of order %s was not recorded (payment %q): %w", orderID, c.payment, err)
	}
	if err := l.sys.Pools["provider"].QueryRow(ctx, `SELECT count(*) FROM captures WHERE reference = $1`, orderID).Scan(&c.ledger); err != nil {
		return c, err
	}
	replays, err := provider.ReadReplays(filepath.Join(l.sys.Work, "provider.log"))
	c.replays = replays[events.CaptureKey(orderID)]
	return c, err
}

// outcome waits for what inventory's inbox did with the copy and says it.
func (l *Lab) outcome(ctx context.Context, w failpoint.Name, msgID, orderID string) error {
	inv := l.sys.Pools["inventory"]
	suppressed := w == failpoint.AfterCommitBeforeAck || w == failpoint.AfterPublishBeforeMark
	var dups, reservations int
	err := waitFor(ctx, func() (bool, error) {
		err := inv.QueryRow(ctx, `
			SELECT coalesce((SELECT duplicates FROM inbox_messages WHERE consumer = 'inventory' AND message_id = $1 AND status = 'processed'), -1),
				(SELECT count(*) FROM reservations WHERE order_id = $2)`, msgID, orderID).Scan(&dups, &reservations)
		if suppressed {
			return dups >= 1, err
		}
		return dups >= 0, err
	})
	if err != nil {
		return fmt.Errorf("waiting for inventory's inbox to record %s: %w", msgID, err)
	}
	if suppressed {
		l.step("suppressed", "inventory's inbox found (inventory, %s) already committed and suppressed the copy: duplicates %d, reservations for the order %d (%s).",
			msgID, dups, reservations, w)
		return nil
	}
	l.step("applied", "Nothing of the first attempt had committed (%s), so the inbox had no row for %s: inventory applied it now, once: reservations for the order %d.",
		w, msgID, reservations)
	return nil
}

// arm asks the victim to arm window w for its next hit.
func arm(ctx context.Context, addr string, w failpoint.Name) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/debug/crash?window="+string(w), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("arming %s: %w", w, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("arming %s: %s: %s (the services must be failpoint builds)", w, res.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func waitFor(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logSize is the failpoint log's length now: a lesson reads what follows.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// kill is a kill line of the failpoint log.
type kill struct {
	pid     int
	subject string
	end     int64 // the log offset just past the line
}

// logAfter returns the failpoint log's whole lines from offset on, and the
// offset past each.
func logAfter(path string, offset int64) ([]string, []int64) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, nil
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, nil
	}
	var lines []string
	var ends []int64
	pos := offset
	for _, line := range strings.SplitAfter(string(data), "\n") {
		pos += int64(len(line))
		if strings.HasSuffix(line, "\n") {
			lines, ends = append(lines, strings.TrimSpace(line)), append(ends, pos)
		}
	}
	return lines, ends
}

// findKill reads the line "failpoint W fired: SIGKILL pid N subject S"
// after offset of window w and process pid: the kill the lesson armed, not
// another process's.
func findKill(path string, offset int64, w failpoint.Name, pid int) (kill, bool) {
	lines, ends := logAfter(path, offset)
	for i, line := range lines {
		prefix := fmt.Sprintf("failpoint %s fired: SIGKILL pid %d subject ", w, pid)
		if subject, ok := strings.CutPrefix(line, prefix); ok && subject != "" {
			return kill{pid: pid, subject: subject, end: ends[i]}, true
		}
	}
	return kill{}, false
}

// deliveries counts the trace lines of before-begin for subject after
// offset, of process pid (any, when 0): the deliveries of that message.
func deliveries(path string, offset int64, subject string, pid int) int {
	lines, _ := logAfter(path, offset)
	prefix := "failpoint " + string(failpoint.BeforeBegin) + " hit: pid "
	if pid != 0 {
		prefix += fmt.Sprint(pid) + " "
	}
	n := 0
	for _, line := range lines {
		if strings.HasPrefix(line, prefix) && strings.HasSuffix(line, " subject "+subject) {
			n++
		}
	}
	return n
}
