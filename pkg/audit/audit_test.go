package audit_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/pkg/audit"
	"github.com/outboxref/outbox-inbox/pkg/pgtest"
)

var pg *pgtest.Server

func TestMain(m *testing.M) { pgtest.TestMain(m, &pg) }

// ledger is the audited system of these tests: each entry says what was
// asked (want) and what was done (got); the invariant is got = want.
type ledger struct {
	pool     *pgxpool.Pool
	state    *pgxpool.Pool // the auditor's: a batch holds a connection while its scan reads pool
	mu       sync.Mutex
	examined map[string]int // entity → times examined
}

func newLedger(t *testing.T) *ledger {
	t.Helper()
	pool := pg.TestDatabase(t)
	require.NoError(t, audit.Migrate(t.Context(), pool))
	_, err := pool.Exec(t.Context(), `CREATE TABLE entries (id text PRIMARY KEY, at timestamptz NOT NULL, want int NOT NULL, got int NOT NULL)`)
	require.NoError(t, err)
	state, err := pgxpool.New(t.Context(), pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(state.Close)
	return &ledger{pool: pool, state: state, examined: map[string]int{}}
}

// add writes entries id0..: at age ago, got = want unless wrong names it.
func (l *ledger) add(t *testing.T, from, n int, age time.Duration, wrong ...int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		got := 1
		for _, w := range wrong {
			if w == i {
				got = 2
			}
		}
		_, err := l.pool.Exec(t.Context(), `INSERT INTO entries VALUES ($1, now() - $2::interval, 1, $3)`,
			fmt.Sprintf("e%03d", i), fmt.Sprintf("%d milliseconds", age.Milliseconds()), got)
		require.NoError(t, err)
	}
}

func (l *ledger) set(t *testing.T, id string, got int) {
	t.Helper()
	_, err := l.pool.Exec(t.Context(), `UPDATE entries SET got = $2 WHERE id = $1`, id, got)
	require.NoError(t, err)
}

func (l *ledger) check() audit.Check {
	return audit.Entities("entries",
		func(ctx context.Context, from audit.Mark, grace time.Duration, limit int) ([]audit.Entity, error) {
			rows, err := l.pool.Query(ctx, `SELECT id, at FROM entries
				WHERE ($1::timestamptz IS NULL OR (at, id) > ($1, $2)) AND at < now() - $3::interval
				ORDER BY at, id LIMIT $4`, nullTime(from.Time), from.Key, fmt.Sprintf("%d milliseconds", grace.Milliseconds()), limit)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowToStructByPos[audit.Entity])
		},
		func(ctx context.Context, keys []string) ([]audit.Finding, error) {
			l.mu.Lock()
			for _, k := range keys {
				l.examined[k]++
			}
			l.mu.Unlock()
			rows, err := l.pool.Query(ctx, `SELECT id, 'wrong', format('got %s, want %s', got, want) FROM entries WHERE id = ANY($1) AND got <> want`, keys)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowToStructByPos[audit.Finding])
		})
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func (l *ledger) auditor(t *testing.T, cfg audit.Config, checks ...audit.Check) *audit.Auditor {
	t.Helper()
	if len(checks) == 0 {
		checks = []audit.Check{l.check()}
	}
	a, err := audit.New(l.state, cfg, checks...)
	require.NoError(t, err)
	return a
}

func (l *ledger) open(t *testing.T) []string {
	t.Helper()
	recs, err := audit.ListFindings(t.Context(), l.pool, audit.ListOptions{})
	require.NoError(t, err)
	var out []string
	for _, r := range recs {
		out = append(out, r.Entity+" "+r.Kind+": "+r.Detail)
	}
	return out
}

func round(t *testing.T, a *audit.Auditor) audit.CheckRound {
	t.Helper()
	r, err := a.Round(t.Context())
	require.NoError(t, err)
	require.Len(t, r.Checks, 1)
	return r.Checks[0]
}

// TestFindingsOpenAndResolve: a wrong entry is a finding; put right, the
// recheck resolves it; wrong again, it opens again (the same row, raised
// twice). An entry past the watermark is not scanned again: only its
// finding is rechecked.
func TestFindingsOpenAndResolve(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 5, time.Hour, 3)
	a := l.auditor(t, audit.Config{Grace: time.Minute})

	r := round(t, a)
	require.Equal(t, 5, r.Examined)
	require.True(t, r.CaughtUp)
	require.Equal(t, []audit.Finding{{Entity: "e003", Kind: "wrong", Detail: "got 2, want 1"}}, r.Raised)
	require.Equal(t, []string{"e003 wrong: got 2, want 1"}, l.open(t))

	r = round(t, a)
	require.Zero(t, r.Examined, "the watermark is past every entry")
	require.Empty(t, r.Raised, "a finding still open is seen again, not raised again")
	require.Equal(t, []string{"e003 wrong: got 2, want 1"}, l.open(t))

	l.set(t, "e003", 1)
	r = round(t, a)
	require.Equal(t, []audit.Finding{{Entity: "e003", Kind: "wrong", Detail: "got 2, want 1"}}, r.Resolved)
	require.Empty(t, l.open(t))

	l.set(t, "e003", 5)
	require.Empty(t, round(t, a).Raised, "a resolved finding's entity is not rechecked")
	// Entries are examined once past the watermark: a breach that comes
	// later is another check's (or a recheck's) to see. e003 was examined
	// by the scan and the three rechecks that saw it open (one in the
	// round that raised it).
	require.Equal(t, 4, l.examined["e003"])
	require.Equal(t, 1, l.examined["e004"])

	status, err := audit.ReadStatus(t.Context(), l.pool)
	require.NoError(t, err)
	require.Len(t, status, 1)
	require.Equal(t, "entries", status[0].Check)
	require.Equal(t, "e004", status[0].Mark.Key)
	require.EqualValues(t, 5, status[0].Examined)
	require.False(t, status[0].CaughtUpAt.IsZero())
	require.Empty(t, status[0].Open)
}

// TestReopened: a finding resolved and found again by a scan is opened
// again, on the same row, raised twice.
func TestReopened(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 1, time.Hour, 0)
	a := l.auditor(t, audit.Config{Grace: time.Minute})
	require.Len(t, round(t, a).Raised, 1)
	l.set(t, "e000", 1)
	require.Len(t, round(t, a).Resolved, 1)
	// The watermark set back: the scan meets e000 again.
	_, err := l.pool.Exec(t.Context(), `UPDATE audit_watermarks SET mark_time = NULL, mark_key = ''`)
	require.NoError(t, err)
	l.set(t, "e000", 3)
	require.Equal(t, []audit.Finding{{Entity: "e000", Kind: "wrong", Detail: "got 3, want 1"}}, round(t, a).Raised)
	recs, err := audit.ListFindings(t.Context(), l.pool, audit.ListOptions{All: true})
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.True(t, recs[0].Open())
	require.Equal(t, 2, recs[0].Raised)
}

// TestGraceLeavesWorkInFlight: an entry younger than the grace period is
// not examined (its work may still be under way); once it is older, it
// is.
func TestGraceLeavesWorkInFlight(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 1, 0, 0)
	a := l.auditor(t, audit.Config{Grace: time.Hour})
	r := round(t, a)
	require.Zero(t, r.Examined)
	require.Empty(t, r.Raised)

	_, err := l.pool.Exec(t.Context(), `UPDATE entries SET at = at - interval '2 hours'`)
	require.NoError(t, err)
	r = round(t, a)
	require.Equal(t, 1, r.Examined)
	require.Len(t, r.Raised, 1)
}

// TestBatchesResumeAfterAFailure: a round reads at most BatchesPerRound
// batches (the rest waits for the next); a batch that fails records
// nothing, its findings nor its watermark nor the state its scan wrote,
// and the next round reads it again.
func TestBatchesResumeAfterAFailure(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 10, time.Hour, 1, 7)
	_, err := l.pool.Exec(t.Context(), `CREATE TABLE scanned (n int NOT NULL)`)
	require.NoError(t, err)

	inner := l.check()
	var fail bool
	c := inner
	c.Scan = func(ctx context.Context, st pgx.Tx, from audit.Mark, grace time.Duration, limit int) (audit.Batch, error) {
		b, err := inner.Scan(ctx, st, from, grace, limit)
		if err != nil {
			return b, err
		}
		// State of the check's own, written in the batch's transaction.
		if _, err := st.Exec(ctx, `INSERT INTO scanned VALUES ($1)`, b.Examined); err != nil {
			return b, err
		}
		if fail {
			return b, errors.New("the audited database went away")
		}
		return b, nil
	}
	a := l.auditor(t, audit.Config{Grace: time.Minute, Batch: 4, BatchesPerRound: 1}, c)

	r := round(t, a)
	require.Equal(t, 4, r.Examined)
	require.False(t, r.CaughtUp)
	require.Equal(t, "e001", r.Raised[0].Entity)

	fail = true
	rr, err := a.Round(t.Context())
	require.ErrorContains(t, err, "went away")
	require.Empty(t, rr.Checks[0].Raised, "a failed batch raises nothing")
	require.Equal(t, 1, l.examined["e007"], "e007 is in the failed batch")
	require.Equal(t, []string{"e001 wrong: got 2, want 1"}, l.open(t), "the failed batch's finding is not recorded")
	var scanned int
	require.NoError(t, l.pool.QueryRow(t.Context(), `SELECT coalesce(sum(n), 0) FROM scanned`).Scan(&scanned))
	require.Equal(t, 4, scanned, "the failed batch's own state rolled back with it")

	fail = false
	a = l.auditor(t, audit.Config{Grace: time.Minute, Batch: 4}, c)
	r = round(t, a)
	require.Equal(t, 6, r.Examined, "the failed batch is read again, then the rest")
	require.True(t, r.CaughtUp)
	require.Equal(t, []audit.Finding{{Entity: "e007", Kind: "wrong", Detail: "got 2, want 1"}}, r.Raised)
	require.NoError(t, l.pool.QueryRow(t.Context(), `SELECT sum(n) FROM scanned`).Scan(&scanned))
	require.Equal(t, 10, scanned)
	for i := range 10 {
		id := fmt.Sprintf("e%03d", i)
		want := 1 // scanned
		switch {
		case i == 1:
			want = 3 // scanned, rechecked in the first round and the last (the failed one rechecks nothing)
		case i == 7:
			want = 3 // scanned by the failed batch and again, then rechecked
		case i >= 4 && i < 8:
			want = 2 // scanned by the failed batch and again
		}
		require.Equal(t, want, l.examined[id], id)
	}
}

// TestReplicasShareTheWork: auditors racing over the same checks examine
// each entity once: a batch holds its check's watermark locked.
func TestReplicasShareTheWork(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 200, time.Hour)
	var wg sync.WaitGroup
	examined := make([]int, 4)
	errs := make([]error, 4)
	for i := range examined {
		a := l.auditor(t, audit.Config{Grace: time.Minute, Batch: 7})
		wg.Go(func() {
			r, err := a.Round(t.Context())
			examined[i], errs[i] = r.Checks[0].Examined, err
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	total := 0
	for _, n := range examined {
		total += n
	}
	require.Equal(t, 200, total, "per auditor: %v", examined)
	for i := range 200 {
		require.Equal(t, 1, l.examined["e"+fmt.Sprintf("%03d", i)], "entry %s", strconv.Itoa(i))
	}
}

func TestConfigRefused(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	for _, cfg := range []audit.Config{{Grace: -1}, {Batch: -1}, {Interval: -time.Second}} {
		_, err := audit.New(l.pool, cfg, l.check())
		require.Error(t, err, "%+v", cfg)
	}
	_, err := audit.New(l.pool, audit.Config{}, l.check(), l.check())
	require.ErrorContains(t, err, "two checks")
	_, err = audit.New(l.pool, audit.Config{}, audit.Check{Name: "x"})
	require.ErrorContains(t, err, "needs a Name and a Scan")
}

// TestRepair: a check's Repair is asked about each open finding after the
// recheck; what it did is recorded and it is not asked again; one that
// failed or did nothing is asked again next round; the repaired entry's
// finding resolves at the next recheck, one whose repair takes effect later
// stays open, repaired, and is not asked again; a finding that opens again
// is repaired again. A failed repair ends the round's repairs.
func TestRepair(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 5, time.Hour, 1, 2, 3, 4)
	asked := map[string]int{}
	down := true
	c := l.check()
	c.Repair = func(ctx context.Context, f audit.Finding) (string, error) {
		asked[f.Entity]++
		switch f.Entity {
		case "e003":
			if down {
				return "", errors.New("the repairing service is down")
			}
		case "e004":
			return "", nil // nothing this repair can do
		case "e002":
			return "asked for it; it takes a while", nil
		}
		if _, err := l.pool.Exec(ctx, `UPDATE entries SET got = want WHERE id = $1`, f.Entity); err != nil {
			return "", err
		}
		return "set got to want", nil
	}
	a := l.auditor(t, audit.Config{Grace: time.Minute}, c)
	repairs := func() map[string]string {
		recs, err := audit.ListFindings(t.Context(), l.pool, audit.ListOptions{All: true})
		require.NoError(t, err)
		out := map[string]string{}
		for _, r := range recs {
			out[r.Entity] = fmt.Sprintf("open=%t repair=%q failed=%q", r.Open(), r.Repair, r.RepairError)
			require.Equal(t, r.Repair == "", r.RepairedAt.IsZero(), r.Entity)
		}
		return out
	}

	r := round(t, a)
	require.Len(t, r.Raised, 4)
	require.Equal(t, []audit.Finding{{Entity: "e001", Kind: "wrong", Detail: "set got to want"},
		{Entity: "e002", Kind: "wrong", Detail: "asked for it; it takes a while"}}, r.Repaired)
	require.Equal(t, map[string]string{
		"e001": `open=true repair="set got to want" failed=""`,
		"e002": `open=true repair="asked for it; it takes a while" failed=""`,
		"e003": `open=true repair="" failed="the repairing service is down"`,
		"e004": `open=true repair="" failed=""`,
	}, repairs())

	down = false
	r = round(t, a)
	require.Equal(t, []audit.Finding{{Entity: "e001", Kind: "wrong", Detail: "got 2, want 1"}}, r.Resolved, "repaired, then rechecked")
	require.Equal(t, []audit.Finding{{Entity: "e003", Kind: "wrong", Detail: "set got to want"}}, r.Repaired)
	round(t, a)
	require.Equal(t, map[string]string{
		"e001": `open=false repair="set got to want" failed=""`,
		"e002": `open=true repair="asked for it; it takes a while" failed=""`,
		"e003": `open=false repair="set got to want" failed=""`,
		"e004": `open=true repair="" failed=""`,
	}, repairs())
	require.Equal(t, map[string]int{"e001": 1, "e002": 1, "e003": 2, "e004": 2}, asked,
		"a repaired finding is not asked again; e003's failure ended the first round's repairs before e004")

	// e001 goes wrong again and the scan meets it again: it opens, and
	// its repair is asked for anew.
	_, err := l.pool.Exec(t.Context(), `UPDATE audit_watermarks SET mark_time = NULL, mark_key = ''`)
	require.NoError(t, err)
	l.set(t, "e001", 7)
	r = round(t, a)
	require.Contains(t, r.Raised, audit.Finding{Entity: "e001", Kind: "wrong", Detail: "got 7, want 1"})
	require.Contains(t, r.Repaired, audit.Finding{Entity: "e001", Kind: "wrong", Detail: "set got to want"})
	require.Equal(t, 2, asked["e001"])
}

// TestRepairsTakeTurns: findings a repair can do nothing about do not
// crowd out a newer one it can repair, however many there are: each round
// asks about the longest unasked first.
func TestRepairsTakeTurns(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 4, 2*time.Hour, 0, 1, 2, 3)
	asked := map[string]int{}
	c := l.check()
	c.Repair = func(ctx context.Context, f audit.Finding) (string, error) {
		asked[f.Entity]++
		if f.Entity != "e003" {
			return "", nil // nothing this repair can do
		}
		return "repaired", nil
	}
	a := l.auditor(t, audit.Config{Grace: time.Minute, Recheck: 2}, c)
	var repaired []audit.Finding
	for range 3 {
		repaired = append(repaired, round(t, a).Repaired...)
	}
	require.Equal(t, []audit.Finding{{Entity: "e003", Kind: "wrong", Detail: "repaired"}}, repaired, "asked %v", asked)
}

// TestRecheckReachesEveryOpenFinding: a round rechecks every open finding,
// however many there are, in batches of Recheck: a backlog of late work
// that ended resolves in the next round, not a batch a round (an open
// finding nobody looked at again would page for work long done).
func TestRecheckReachesEveryOpenFinding(t *testing.T) {
	t.Parallel()
	l := newLedger(t)
	l.add(t, 0, 7, time.Hour, 0, 1, 2, 3, 4, 5, 6)
	a := l.auditor(t, audit.Config{Grace: time.Minute, Recheck: 2})
	require.Len(t, round(t, a).Raised, 7)
	for i := range 7 {
		l.set(t, fmt.Sprintf("e%03d", i), 1)
	}
	require.Len(t, round(t, a).Resolved, 7, "every open finding rechecked in one round")
	require.Empty(t, l.open(t))
	for i := range 7 {
		require.Equal(t, 3, l.examined[fmt.Sprintf("e%03d", i)], "e%03d: the scan, then one recheck a round", i)
	}
}
