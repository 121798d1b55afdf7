package audit

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outbox-inbox/pkg/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations holds the auditor's SQL files, for programs that apply
// migrations with their own tool. Migrate applies them.
var Migrations = func() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}()

// Migrate creates or updates the auditor's tables (audit_watermarks,
// audit_findings) in the database its state lives in.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate.Apply(ctx, pool, "audit", Migrations)
}

// Mark is a place in a check's order: the time and key of the last entity
// it examined. The zero Mark is before everything.
type Mark struct {
	Time time.Time
	Key  string
}

// Finding is one breach: what it concerns (an order's id, a SKU), its kind
// (a short name an alert and a runbook can key on) and what was seen, in a
// sentence.
type Finding struct {
	Entity string
	Kind   string
	Detail string
}

// Batch is what one Scan examined and found.
type Batch struct {
	Findings []Finding
	// Examined counts the entities read; fewer than the limit means the
	// check has caught up with its grace period.
	Examined int
	// Next is the watermark after this batch: the mark of the last entity
	// examined (from itself when none was).
	Next Mark
}

// Check is one invariant, audited behind a watermark.
type Check struct {
	// Name names the check in audit_watermarks, audit_findings and the
	// metrics.
	Name string
	// Scan examines, in the check's order, at most limit entities after
	// from that are older than grace (so what is still in flight is never
	// a finding), and returns what it found. state is the transaction
	// that records the batch (its findings and the new watermark): a check
	// that keeps state of its own in the auditor's database (a running
	// total) writes it there, so it moves with the watermark or not at all.
	Scan func(ctx context.Context, state pgx.Tx, from Mark, grace time.Duration, limit int) (Batch, error)
	// Recheck examines again the entities of open findings and returns the
	// findings that still hold about them; every open finding about these
	// entities that it does not return is resolved. mark is the check's
	// watermark. Nil: a finding stays open until an operator resolves it
	// (audit_findings.resolved_at).
	Recheck func(ctx context.Context, state pgx.Tx, mark Mark, entities []string) ([]Finding, error)
	// Repair, when set, is asked to repair each open finding of the check
	// not repaired yet, after the recheck of each round. It returns what
	// it did, in a sentence ("": nothing it can do about this finding now;
	// asked again next round), or an error (asked again next round;
	// audit_findings.repair_error says why). What it did is recorded on
	// the finding (repair, repaired_at), and it is not asked again unless
	// the finding resolves and opens again. No transaction is held while
	// it runs: two replicas may ask about the same finding, and a repair
	// whose record was lost (the auditor killed between the two) is asked
	// again if the finding still holds: it must be idempotent, like the
	// operation it asks for. (If the repair made the finding hold no more,
	// the recheck resolves it, and what was done shows in the audited
	// system, not on the finding.)
	Repair func(ctx context.Context, f Finding) (string, error)
}

// Entity is one entity an entity check reads past its watermark: its key
// and its time in the check's order.
type Entity struct {
	Key  string
	Time time.Time
}

// Entities makes the usual check: next lists the settled entities past the
// watermark (older than grace, in (time, key) order, at most limit), and
// examine returns the findings about some entities. A scan examines what
// next listed; a recheck examines the open findings' entities again, so a
// finding that no longer holds (an answer that was late, not lost)
// resolves itself.
func Entities(name string,
	next func(ctx context.Context, from Mark, grace time.Duration, limit int) ([]Entity, error),
	examine func(ctx context.Context, keys []string) ([]Finding, error)) Check {
	return Check{
		Name: name,
		Scan: func(ctx context.Context, _ pgx.Tx, from Mark, grace time.Duration, limit int) (Batch, error) {
			ents, err := next(ctx, from, grace, limit)
			if err != nil || len(ents) == 0 {
				return Batch{Next: from}, err
			}
			keys := make([]string, len(ents))
			for i, e := range ents {
				keys[i] = e.Key
			}
			found, err := examine(ctx, keys)
			last := ents[len(ents)-1]
			return Batch{Findings: found, Examined: len(ents), Next: Mark{last.Time, last.Key}}, err
		},
		Recheck: func(ctx context.Context, _ pgx.Tx, _ Mark, entities []string) ([]Finding, error) {
			return examine(ctx, entities)
		},
	}
}

// Defaults of Config.
const (
	GraceDefault           = 2 * time.Minute
	BatchDefault           = 1000
	BatchesPerRoundDefault = 100
	RecheckDefault         = 1000
	IntervalDefault        = 5 * time.Second
)

// Config configures an Auditor.
type Config struct {
	// Grace is how old an entity must be before it is examined: longer
	// than the work it audits normally takes (a paid order answered, a
	// capture made), so nothing in flight is a finding. A finding that
	// was only late resolves itself at the next recheck. Defaults to
	// GraceDefault.
	Grace time.Duration
	// Batch bounds the entities one scan reads. Defaults to BatchDefault.
	Batch int
	// BatchesPerRound bounds one check's scans in a round, so a check
	// catching up on a backlog (its first round over a large table) does
	// not hold the others back. Defaults to BatchesPerRoundDefault.
	BatchesPerRound int
	// Recheck bounds the open findings' entities a check examines again in
	// one batch, the longest unseen first; a round rechecks every open
	// finding in batches, up to BatchesPerRound of them. Defaults to
	// RecheckDefault.
	Recheck int
	// Interval is the pause between Run's rounds. Defaults to
	// IntervalDefault.
	Interval time.Duration
	// Logger receives a line per finding raised or resolved. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Grace == 0 {
		c.Grace = GraceDefault
	}
	if c.Batch == 0 {
		c.Batch = BatchDefault
	}
	if c.BatchesPerRound == 0 {
		c.BatchesPerRound = BatchesPerRoundDefault
	}
	if c.Recheck == 0 {
		c.Recheck = RecheckDefault
	}
	if c.Interval == 0 {
		c.Interval = IntervalDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports a configuration New refuses, naming the field.
func (c Config) Validate() error {
	switch {
	case c.Grace < 0:
		return errors.New("audit: Config.Grace must not be negative")
	case c.Batch < 0, c.BatchesPerRound < 0, c.Recheck < 0:
		return errors.New("audit: Config.Batch, BatchesPerRound and Recheck must not be negative")
	case c.Interval < 0:
		return errors.New("audit: Config.Interval must not be negative")
	}
	return nil
}

// Auditor runs checks in rounds and records what they find in its
// database (state). Replicas may run side by side: a check's batch holds
// its watermark's row locked, so each batch is examined by one of them.
type Auditor struct {
	state  *pgxpool.Pool
	cfg    Config
	checks []Check
}

// New returns an Auditor of checks, its state in the database of state
// (Migrate applied). Each batch holds one of state's connections while its
// check's scan reads the audited databases: a check must not read through
// state's pool (a pool that every batch holds a connection of would be
// drained by concurrent rounds and wait for itself).
func New(state *pgxpool.Pool, cfg Config, checks ...Check) (*Auditor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	seen := map[string]bool{}
	for _, c := range checks {
		switch {
		case c.Name == "" || c.Scan == nil:
			return nil, errors.New("audit: a check needs a Name and a Scan")
		case seen[c.Name]:
			return nil, fmt.Errorf("audit: two checks named %q", c.Name)
		}
		seen[c.Name] = true
	}
	return &Auditor{state: state, cfg: cfg, checks: checks}, nil
}

// Round is what one round did, per check.
type Round struct {
	Checks []CheckRound
}

// CheckRound is what one check did in a round.
type CheckRound struct {
	Check    string
	Examined int  // entities scanned past the watermark
	CaughtUp bool // the last scan found fewer than Batch: up to the grace period
	Raised   []Finding
	Resolved []Finding
	Repaired []Finding // each with what its repair did as Detail
	Err      error
}

// Raised returns every finding the round opened.
func (r Round) Raised() []Finding {
	var out []Finding
	for _, c := range r.Checks {
		out = append(out, c.Raised...)
	}
	return out
}

// Run runs a round every Interval until ctx ends. A round's errors are
// logged, not returned: the next round tries again.
func (a *Auditor) Run(ctx context.Context) error {
	for {
		if _, err := a.Round(ctx); err != nil && ctx.Err() == nil {
			a.cfg.Logger.Error("audit round failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(a.cfg.Interval):
		}
	}
}

// Round runs each check once: scans past its watermark until it catches up
// (at most BatchesPerRound batches), then examines its open findings
// again. One check's error does not stop the others; the errors are
// joined.
func (a *Auditor) Round(ctx context.Context) (Round, error) {
	var r Round
	var errs []error
	for _, c := range a.checks {
		cr := a.round(ctx, c)
		if cr.Err != nil {
			errs = append(errs, fmt.Errorf("check %s: %w", c.Name, cr.Err))
		}
		r.Checks = append(r.Checks, cr)
	}
	return r, errors.Join(errs...)
}

func (a *Auditor) round(ctx context.Context, c Check) CheckRound {
	cr := CheckRound{Check: c.Name}
	for range a.cfg.BatchesPerRound {
		n, raised, err := a.scan(ctx, c)
		cr.Examined += n
		cr.Raised = append(cr.Raised, raised...)
		if err != nil {
			cr.Err = err
			return cr
		}
		if n < a.cfg.Batch {
			cr.CaughtUp = true
			break
		}
	}
	if c.Recheck != nil {
		cr.Err = a.rechecks(ctx, c, &cr)
	}
	if c.Repair != nil && cr.Err == nil {
		cr.Repaired, cr.Err = a.repair(ctx, c)
	}
	for _, f := range cr.Raised {
		a.cfg.Logger.Warn("audit finding", "check", c.Name, "entity", f.Entity, "kind", f.Kind, "detail", f.Detail)
	}
	for _, f := range cr.Resolved {
		a.cfg.Logger.Info("audit finding resolved", "check", c.Name, "entity", f.Entity, "kind", f.Kind, "was", f.Detail)
	}
	for _, f := range cr.Repaired {
		a.cfg.Logger.Warn("audit finding repaired", "check", c.Name, "entity", f.Entity, "kind", f.Kind, "repair", f.Detail)
	}
	return cr
}

// repair asks c.Repair about c's open findings not repaired yet, in turn
// (the longest unasked first), and records, each in a transaction of its
// own, what it did or why it failed. No transaction is open while Repair
// runs (it may call another service), so replicas may both ask about a
// finding: Repair is idempotent. The first failure ends the round's
// repairs (a service down is not asked a thousand times): the rest are
// asked next round, before the failed one.
func (a *Auditor) repair(ctx context.Context, c Check) ([]Finding, error) {
	rows, err := a.state.Query(ctx, `SELECT entity, kind, detail FROM audit_findings
		WHERE check_name = $1 AND resolved_at IS NULL AND repaired_at IS NULL
		ORDER BY repair_tried_at NULLS FIRST, first_seen, entity, kind LIMIT $2`, c.Name, a.cfg.Recheck)
	if err != nil {
		return nil, fmt.Errorf("listing findings to repair: %w", err)
	}
	todo, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Finding])
	if err != nil {
		return nil, fmt.Errorf("listing findings to repair: %w", err)
	}
	var repaired []Finding
	for _, f := range todo {
		did, rerr := c.Repair(ctx, f)
		if rerr != nil && ctx.Err() != nil {
			return repaired, ctx.Err()
		}
		var failed *string
		if rerr != nil {
			msg := rerr.Error()
			if len(msg) > maxRepairError {
				msg = strings.ToValidUTF8(msg[:maxRepairError], "") + "…"
			}
			failed = &msg
		}
		if _, err := a.state.Exec(ctx, `UPDATE audit_findings SET repair_tried_at = now(), repair_error = $5,
				repair = coalesce(nullif($4, ''), repair), repaired_at = CASE WHEN $4 <> '' THEN now() ELSE repaired_at END
			WHERE check_name = $1 AND entity = $2 AND kind = $3`, c.Name, f.Entity, f.Kind, did, failed); err != nil {
			return repaired, fmt.Errorf("recording a repair: %w", err)
		}
		switch {
		case rerr != nil:
			a.cfg.Logger.Warn("audit repair failed; asked again next round", "check", c.Name, "entity", f.Entity, "kind", f.Kind, "err", rerr)
			return repaired, nil
		case did != "":
			repaired = append(repaired, Finding{Entity: f.Entity, Kind: f.Kind, Detail: did})
		}
	}
	return repaired, nil
}

// maxRepairError bounds the reason a failed repair records.
const maxRepairError = 1000

// scan examines one batch past c's watermark and records it: its findings
// and the new watermark commit together.
func (a *Auditor) scan(ctx context.Context, c Check) (examined int, raised []Finding, err error) {
	err = pgx.BeginFunc(ctx, a.state, func(tx pgx.Tx) error {
		from, err := lockMark(ctx, tx, c.Name)
		if err != nil {
			return err
		}
		b, err := c.Scan(ctx, tx, from, a.cfg.Grace, a.cfg.Batch)
		if err != nil {
			return err
		}
		if raised, err = record(ctx, tx, c.Name, b.Findings); err != nil {
			return err
		}
		examined = b.Examined
		_, err = tx.Exec(ctx, `UPDATE audit_watermarks SET mark_time = $2, mark_key = $3, examined = examined + $4,
			batch_at = now(), caught_up_at = CASE WHEN $5 THEN now() ELSE caught_up_at END
			WHERE check_name = $1`, c.Name, nullTime(b.Next.Time), b.Next.Key, b.Examined, b.Examined < a.cfg.Batch)
		return err
	})
	return examined, raised, err
}

// rechecks examines every open finding of c not seen since the rechecks
// began, a batch of Recheck entities at a time, the longest unseen first,
// up to BatchesPerRound batches: a backlog of open findings (a late hour's
// worth of orders, each a finding) is rechecked within a round or a few,
// not a batch a round, so what was only late resolves as soon as it ends.
func (a *Auditor) rechecks(ctx context.Context, c Check, cr *CheckRound) error {
	var since time.Time
	if err := a.state.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&since); err != nil {
		return fmt.Errorf("reading the clock: %w", err)
	}
	for range a.cfg.BatchesPerRound {
		n, raised, resolved, err := a.recheck(ctx, c, since)
		cr.Raised, cr.Resolved = append(cr.Raised, raised...), append(cr.Resolved, resolved...)
		if err != nil || n < a.cfg.Recheck {
			return err
		}
	}
	return nil
}

// recheck examines again the entities of c's open findings not seen since
// since, up to Recheck of them: what still holds is seen again, what no
// longer holds is resolved. It returns how many entities it examined.
func (a *Auditor) recheck(ctx context.Context, c Check, since time.Time) (n int, raised, resolved []Finding, err error) {
	err = pgx.BeginFunc(ctx, a.state, func(tx pgx.Tx) error {
		mark, err := lockMark(ctx, tx, c.Name)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT entity FROM audit_findings WHERE check_name = $1 AND resolved_at IS NULL
			GROUP BY entity HAVING min(last_seen) < $3 ORDER BY min(last_seen), entity LIMIT $2`, c.Name, a.cfg.Recheck, since)
		if err != nil {
			return err
		}
		entities, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(entities) == 0 {
			return err
		}
		n = len(entities)
		found, err := c.Recheck(ctx, tx, mark, entities)
		if err != nil {
			return err
		}
		found = slices.DeleteFunc(found, func(f Finding) bool { return !slices.Contains(entities, f.Entity) })
		if raised, err = record(ctx, tx, c.Name, found); err != nil {
			return err
		}
		es, ks := columns(found)
		rows, err = tx.Query(ctx, `UPDATE audit_findings a SET resolved_at = now()
			WHERE check_name = $1 AND resolved_at IS NULL AND entity = ANY($2)
			AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS f(entity, kind) WHERE f.entity = a.entity AND f.kind = a.kind)
			RETURNING entity, kind, detail`, c.Name, entities, es, ks)
		if err != nil {
			return err
		}
		resolved, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Finding])
		return err
	})
	return n, raised, resolved, err
}

// lockMark reads check's watermark, creating it, and holds its row locked
// until tx ends.
func lockMark(ctx context.Context, tx pgx.Tx, check string) (Mark, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO audit_watermarks (check_name) VALUES ($1) ON CONFLICT DO NOTHING`, check); err != nil {
		return Mark{}, fmt.Errorf("creating watermark: %w", err)
	}
	var m Mark
	var t *time.Time
	if err := tx.QueryRow(ctx, `SELECT mark_time, mark_key FROM audit_watermarks WHERE check_name = $1 FOR UPDATE`, check).Scan(&t, &m.Key); err != nil {
		return Mark{}, fmt.Errorf("reading watermark: %w", err)
	}
	if t != nil {
		m.Time = *t
	}
	return m, nil
}

// record writes findings: a new one is inserted, one already open is seen
// again, a resolved one is opened again. It returns those it opened.
func record(ctx context.Context, tx pgx.Tx, check string, found []Finding) ([]Finding, error) {
	found = dedupe(found)
	if len(found) == 0 {
		return nil, nil
	}
	es, ks := columns(found)
	ds := make([]string, len(found))
	for i, f := range found {
		ds[i] = f.Detail
	}
	rows, err := tx.Query(ctx, `WITH f AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) AS f(entity, kind, detail)),
		was_open AS (SELECT a.entity, a.kind FROM audit_findings a JOIN f USING (entity, kind)
			WHERE a.check_name = $1 AND a.resolved_at IS NULL)
		INSERT INTO audit_findings AS a (check_name, entity, kind, detail)
		SELECT $1, entity, kind, detail FROM f
		ON CONFLICT (check_name, entity, kind) DO UPDATE SET detail = excluded.detail, last_seen = now(),
			raised = a.raised + (a.resolved_at IS NOT NULL)::int, resolved_at = NULL,
			repair = CASE WHEN a.resolved_at IS NULL THEN a.repair END,
			repaired_at = CASE WHEN a.resolved_at IS NULL THEN a.repaired_at END,
			repair_error = CASE WHEN a.resolved_at IS NULL THEN a.repair_error END,
			repair_tried_at = CASE WHEN a.resolved_at IS NULL THEN a.repair_tried_at END
		RETURNING a.entity, a.kind, a.detail,
			NOT EXISTS (SELECT 1 FROM was_open o WHERE o.entity = a.entity AND o.kind = a.kind)`, check, es, ks, ds)
	if err != nil {
		return nil, fmt.Errorf("recording findings: %w", err)
	}
	var opened []Finding
	var f Finding
	var isNew bool
	_, err = pgx.ForEachRow(rows, []any{&f.Entity, &f.Kind, &f.Detail, &isNew}, func() error {
		if isNew {
			opened = append(opened, f)
		}
		return nil
	})
	return opened, err
}

// dedupe keeps the last finding of each (entity, kind): one statement may
// not write a row twice.
func dedupe(found []Finding) []Finding {
	type key struct{ e, k string }
	at := map[key]int{}
	var out []Finding
	for _, f := range found {
		if i, ok := at[key{f.Entity, f.Kind}]; ok {
			out[i] = f
			continue
		}
		at[key{f.Entity, f.Kind}] = len(out)
		out = append(out, f)
	}
	return out
}

func columns(found []Finding) (entities, kinds []string) {
	entities, kinds = make([]string, len(found)), make([]string, len(found))
	for i, f := range found {
		entities[i], kinds[i] = f.Entity, f.Kind
	}
	return entities, kinds
}

// nullTime is t, or NULL for the zero time (nothing examined yet).
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
