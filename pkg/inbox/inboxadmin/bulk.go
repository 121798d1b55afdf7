package inboxadmin

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/outbox/outboxadmin"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// Bulk actions. An operator retries or drops many quarantined messages at
// once (a failure group, a kind, an event type) in three steps:
//
//  1. DryRun counts what a Selection chooses, and pins it to the rows that
//     exist now (Plan.Selection.UpTo): messages quarantined later are not
//     part of what the operator was shown.
//  2. StartBulk, given that Plan (the operator confirmed its count),
//     records the action in the history (inbox_actions: who, when, what,
//     the selection, how many) and the messages it chose
//     (inbox_action_items), in one transaction; if the selection no longer
//     holds the messages confirmed (another operator resolved some
//     meanwhile; as many, but a row parked since), it refuses with
//     ErrSelectionChanged and records nothing. A plan is started once: a
//     confirmation sent twice is one action.
//  3. RunBulk does the action's messages in batches, each in one
//     transaction that retries or drops them (Retry's and
//     Drop's work, row by row) and marks them done with their
//     outcome, and reports progress after each batch.
//
// So an action is resumable and idempotent: killed half-way, RunBulk again
// (ListActions with ActionFilter.Running lists what is left) goes on with the messages not yet
// marked, and none is done twice, because a message is marked in the
// transaction that does it. Two actions choosing the same message do it
// once: the second finds it resolved (skipped). The single-message
// Retry and Drop record an action of one message, so
// the history holds every change an operator made through this package.

// The actions.
const (
	ActionRetry = "retry" // Retry each message
	ActionDrop  = "drop"  // Drop each message
)

// An action's states.
const (
	ActionRunning  = "running"  // RunBulk does it, or resumes it
	ActionStopped  = "stopped"  // StopBulk stopped it: its other messages stay as they are
	ActionFinished = "finished" // every message it chose has its outcome
)

// An item's outcomes.
const (
	OutcomeDone    = "done"    // redriven or discarded
	OutcomeSkipped = "skipped" // already resolved, or applied meanwhile: nothing to do
	OutcomeRefused = "refused" // cannot be redriven (a payload conflict, an invalid message): drop it instead
)

var (
	// ErrSelectionChanged: the selection no longer holds the messages the
	// operator confirmed (their count, or, given Plan.Digest, which they
	// are). Dry-run again.
	ErrSelectionChanged = errors.New("inbox: the selection changed since its dry run")
	// ErrNothingSelected: a bulk action needs at least one message.
	ErrNothingSelected = errors.New("inbox: the selection holds no open message")
	// ErrPlanStarted: the dry run was started already, as another action
	// (another operator, another reason). Dry-run again.
	ErrPlanStarted = errors.New("inbox: the dry run was started already")
	// ErrNoAction: no action has that id.
	ErrNoAction = errors.New("inbox: no action with that id")
)

// Selection chooses the open quarantined messages of one consumer that a
// bulk action acts on, or, with Parked, the parked rows of the outbox in
// its database (the relay's, pkg/outbox park.go). Empty fields choose
// everything.
type Selection struct {
	Consumer  string  `json:"consumer"`
	Group     string  `json:"group,omitempty"` // a failure group's ID
	Kind      string  `json:"kind,omitempty"`
	EventType string  `json:"event_type,omitempty"`
	IDs       []int64 `json:"ids,omitempty"` // only these rows
	// Holding chooses only the dead letters that hold their key
	// (inbox.Config.OnDeadLetter = inbox.HoldKey): retried, each releases its key's
	// parked messages once applied; dropped, at once.
	Holding bool `json:"holding,omitempty"`
	// Parked chooses parked outbox rows instead (of Topic, when set; IDs
	// are then outbox row ids): a retry unparks each (outbox.RetryParked),
	// a drop moves it to outbox_dropped with who and why
	// (outbox.DropParked). Group, Kind, EventType and Holding do not apply.
	Parked bool   `json:"parked,omitempty"`
	Topic  string `json:"topic,omitempty"`
	// UpTo, set by DryRun, leaves out the rows quarantined after the dry
	// run (ids above it).
	UpTo int64 `json:"up_to,omitempty"`
}

// selected is the table a Selection chooses from (inbox_quarantine, or
// outbox_messages for parked rows) and its WHERE clause, with its
// arguments from $1.
func (s Selection) selected() (string, string, []any) {
	var ids []int64 // nil, NULL, when none: every id
	if len(s.IDs) > 0 {
		ids = s.IDs
	}
	if s.Parked {
		return "outbox_messages", `parked_at IS NOT NULL AND ($1 = '' OR topic = $1) AND ($2::bigint[] IS NULL OR id = ANY($2))
			AND ($3 = 0 OR id <= $3)`, []any{s.Topic, ids, s.UpTo}
	}
	return "inbox_quarantine", `consumer = $1 AND resolved_at IS NULL AND ($2 = '' OR failure_group = $2) AND ($3 = '' OR kind = $3)
		AND ($4 = '' OR metadata->>'event_type' = $4) AND ($5::bigint[] IS NULL OR id = ANY($5))
		AND ($6 = 0 OR id <= $6)
		AND (NOT $7 OR EXISTS (SELECT 1 FROM inbox_held_keys h WHERE h.consumer = inbox_quarantine.consumer
			AND h.topic = inbox_quarantine.topic AND h.holder = inbox_quarantine.message_id AND h.state = 'held'))`,
		[]any{s.Consumer, s.Group, s.Kind, s.EventType, ids, s.UpTo, s.Holding}
}

func (s Selection) validate() error {
	switch {
	case strings.TrimSpace(s.Consumer) == "":
		return errors.New("inbox: a selection needs its consumer")
	case s.Parked && (s.Group != "" || s.Kind != "" || s.EventType != "" || s.Holding):
		return errors.New("inbox: a selection of parked rows takes a topic and ids, not a group, kind, event type or held keys")
	case !s.Parked && s.Topic != "":
		return errors.New("inbox: a topic selects parked rows (Selection.Parked)")
	}
	return nil
}

// Plan is a dry run's answer: how many messages the selection chooses, and
// the selection pinned to them.
type Plan struct {
	Selection Selection
	Count     int64
	// Digest names the very rows counted (a hash of their ids): StartBulk,
	// given it, refuses a selection that holds as many rows but not the
	// same (a row parked, or a key held, since the dry run, as another left
	// it). Empty, StartBulk compares counts only.
	Digest string
	// ID names this dry run (random): StartBulk starts it once. Empty (a
	// plan built by hand), each start is an action of its own.
	ID string
}

// digestOf is the SQL of a Plan's Digest over the ids column of a query.
func digestOf(ids string) string {
	return `coalesce(left(md5(string_agg(` + ids + `::text, ',' ORDER BY ` + ids + `)), 16), '')`
}

// DryRun counts the open messages s chooses. It changes nothing.
func (adm *Admin) DryRun(ctx context.Context, s Selection) (Plan, error) {
	if err := s.validate(); err != nil {
		return Plan{}, err
	}
	table, where, args := s.selected()
	var upTo *int64
	var n int64
	var digest string
	err := adm.pool.QueryRow(ctx, `SELECT count(*), max(id), `+digestOf("id")+` FROM `+table+` WHERE `+where,
		append([]any{schema.PlanEachTime}, args...)...).Scan(&n, &upTo, &digest)
	if err != nil {
		return Plan{}, fmt.Errorf("inbox: counting the selection: %w", err)
	}
	if upTo != nil && s.UpTo == 0 {
		s.UpTo = *upTo
	}
	return Plan{Selection: s, Count: n, Digest: digest, ID: rand.Text()[:16]}, nil
}

// Action is one entry of the history: what an operator did, or is doing,
// to quarantined messages.
type Action struct {
	ID        int64
	Consumer  string
	Action    string // ActionRetry or ActionDrop
	Actor     string
	Why       string
	Selection Selection
	Selected  int64 // messages it chose
	Done      int64 // redriven or discarded
	Skipped   int64 // resolved meanwhile, or applied: nothing to do
	Refused   int64 // could not be redriven
	State     string
	StoppedBy string // who stopped it (ActionStopped)
	StartedAt time.Time
	UpdatedAt time.Time
	// FinishedAt is set once every message it chose has its outcome, or
	// once it was stopped.
	FinishedAt *time.Time
}

// Remaining is how many of its messages are still to do.
func (a Action) Remaining() int64 { return a.Selected - a.Done - a.Skipped - a.Refused }

const actionColumns = `id, consumer, action, actor, why, selection, selected, done, skipped, refused, state, coalesce(stopped_by, ''), started_at, updated_at, finished_at`

func scanAction(row pgx.Row) (Action, error) {
	var a Action
	err := row.Scan(&a.ID, &a.Consumer, &a.Action, &a.Actor, &a.Why, &a.Selection, &a.Selected, &a.Done,
		&a.Skipped, &a.Refused, &a.State, &a.StoppedBy, &a.StartedAt, &a.UpdatedAt, &a.FinishedAt)
	return a, err
}

// StartBulk records action (ActionRetry or ActionDrop) of by, with why
// (required for a drop), on the messages plan counted, and chooses them.
// It does none of them: RunBulk does. It refuses with ErrSelectionChanged
// when the selection holds other than plan.Count messages now, or, given
// plan.Digest, other messages. A dry run is started once: its plan started
// again (a confirmation sent twice) returns the action the first start
// recorded, running or finished, or ErrPlanStarted if that was another
// action, operator or reason.
func (adm *Admin) StartBulk(ctx context.Context, action string, plan Plan, by, why string) (Action, error) {
	switch {
	case action != ActionRetry && action != ActionDrop:
		return Action{}, fmt.Errorf("inbox: no bulk action %q: %s or %s", action, ActionRetry, ActionDrop)
	case strings.TrimSpace(by) == "":
		return Action{}, errors.New("inbox: a bulk action needs who does it")
	case action == ActionDrop && strings.TrimSpace(why) == "":
		return Action{}, errors.New("inbox: a bulk drop needs why")
	case plan.Count <= 0:
		return Action{}, ErrNothingSelected
	}
	if err := plan.Selection.validate(); err != nil {
		return Action{}, err
	}
	selection, err := json.Marshal(plan.Selection)
	if err != nil {
		return Action{}, err
	}
	var a Action
	err = pgx.BeginTxFunc(ctx, adm.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		var plannedBy *string
		if plan.ID != "" {
			plannedBy = &plan.ID
		}
		// A plan started twice at once: the second INSERT waits for the
		// first's commit, then does nothing, and (read committed) the next
		// statement sees the first's action.
		a, err = scanAction(tx.QueryRow(ctx, `INSERT INTO inbox_actions (consumer, action, actor, why, selection, selected, plan)
			VALUES ($1, $2, $3, $4, $5, 0, $6) ON CONFLICT (plan) WHERE plan IS NOT NULL DO NOTHING
			RETURNING `+actionColumns, plan.Selection.Consumer, action, by, why, selection, plannedBy))
		if errors.Is(err, pgx.ErrNoRows) {
			a, err = scanAction(tx.QueryRow(ctx, `SELECT `+actionColumns+` FROM inbox_actions WHERE plan = $1`, plan.ID))
			if err != nil {
				return fmt.Errorf("inbox: reading the action of dry run %s: %w", plan.ID, err)
			}
			if a.Action != action || a.Actor != by || a.Why != why {
				return fmt.Errorf("%w: dry run %s was started as action %d (%s by %s)", ErrPlanStarted, plan.ID, a.ID, a.Action, a.Actor)
			}
			return nil // started already: that action
		}
		if err != nil {
			return fmt.Errorf("inbox: recording the action: %w", err)
		}
		table, where, args := plan.Selection.selected()
		// The rows chosen, counted and named (Plan.Digest) as they are
		// written, in one statement.
		var n int64
		var digest string
		err = tx.QueryRow(ctx, fmt.Sprintf(`WITH chosen AS (INSERT INTO inbox_action_items (action_id, quarantine_id)
			SELECT $%d, id FROM %s WHERE %s RETURNING quarantine_id)
			SELECT count(*), %s FROM chosen`, len(args)+1, table, where, digestOf("quarantine_id")),
			append(append([]any{schema.PlanEachTime}, args...), a.ID)...).Scan(&n, &digest)
		if err != nil {
			return fmt.Errorf("inbox: choosing the messages: %w", err)
		}
		if n != plan.Count {
			return fmt.Errorf("%w: it holds %d open messages, %d when counted", ErrSelectionChanged, n, plan.Count)
		}
		if plan.Digest != "" && digest != plan.Digest {
			return fmt.Errorf("%w: it holds %d open messages as when counted, but not the same", ErrSelectionChanged, plan.Count)
		}
		a.Selected = plan.Count
		_, err = tx.Exec(ctx, `UPDATE inbox_actions SET selected = $2 WHERE id = $1`, a.ID, a.Selected)
		return err
	})
	if err != nil {
		return Action{}, err
	}
	return a, nil
}

// BulkOptions tunes RunBulk.
type BulkOptions struct {
	// BatchSize is how many messages one transaction does. Defaults to 100.
	BatchSize int
	// Progress, when set, is called after each batch commits, with the
	// action as it stands.
	Progress func(Action)
}

// RunBulk does the messages of action id not done yet, a batch per
// transaction, until none is left; then the action is finished. It is what
// resumes an action that was stopped (killed, its context cancelled, a
// database error): each message is done once however often it runs, and
// two RunBulk of one action take turns. A message that cannot be redriven
// or written back is refused, with the reason on its item, and the action
// goes on. A batch undone by a deadlock (another action or a delivery
// locking the same keys in another order) is done again.
func (adm *Admin) RunBulk(ctx context.Context, id int64, opt BulkOptions) (Action, error) {
	if opt.BatchSize <= 0 {
		opt.BatchSize = 100
	}
	conflicts := 0
	for {
		a := Action{ID: id}
		err := pgx.BeginFunc(ctx, adm.pool, func(tx pgx.Tx) error {
			var err error
			a, err = scanAction(tx.QueryRow(ctx, `SELECT `+actionColumns+` FROM inbox_actions WHERE id = $1 FOR UPDATE`, id))
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %d", ErrNoAction, id)
			}
			if err != nil || a.State != ActionRunning {
				return err
			}
			return a.batch(ctx, tx, opt.BatchSize, adm.parked)
		})
		if retryable(err) && conflicts < maxBatchConflicts {
			// Another transaction took the same keys' locks in another
			// order (two actions at once, a delivery): the batch, undone
			// whole, is done again.
			conflicts++
			continue
		}
		if err != nil {
			return Action{ID: id}, fmt.Errorf("inbox: action %d: %w", id, err)
		}
		conflicts = 0
		if opt.Progress != nil {
			opt.Progress(a)
		}
		if a.State != ActionRunning {
			return a, nil
		}
	}
}

// maxBatchConflicts is how many times in a row RunBulk does a batch again
// that a deadlock or a serialization failure undid.
const maxBatchConflicts = 10

// retryable reports whether err undid a transaction that may simply be run
// again: a deadlock (40P01) or a serialization failure (40001).
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// batch does up to n of a's messages in tx, marks each with its outcome and
// counts them on a; with none left, it finishes a.
func (a *Action) batch(ctx context.Context, tx pgx.Tx, n int, parked *outboxadmin.Admin) error {
	rows, err := tx.Query(ctx, `SELECT quarantine_id FROM inbox_action_items
		WHERE action_id = $1 AND outcome IS NULL ORDER BY quarantine_id LIMIT $2`, a.ID, n)
	if err != nil {
		return err
	}
	todo, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	if len(todo) == 0 {
		return tx.QueryRow(ctx, `UPDATE inbox_actions SET state = 'finished', finished_at = now(), updated_at = now()
			WHERE id = $1 RETURNING state, finished_at, updated_at`, a.ID).Scan(&a.State, &a.FinishedAt, &a.UpdatedAt)
	}
	for _, qid := range todo {
		outcome, note, err := a.do(ctx, tx, qid, parked)
		if err != nil {
			return fmt.Errorf("message %d: %w", qid, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE inbox_action_items SET outcome = $3, note = $4, done_at = now()
			WHERE action_id = $1 AND quarantine_id = $2`, a.ID, qid, outcome, note); err != nil {
			return err
		}
		switch outcome {
		case OutcomeDone:
			a.Done++
		case OutcomeSkipped:
			a.Skipped++
		default:
			a.Refused++
		}
	}
	return tx.QueryRow(ctx, `UPDATE inbox_actions SET done = $2, skipped = $3, refused = $4, updated_at = now()
		WHERE id = $1 RETURNING updated_at`, a.ID, a.Done, a.Skipped, a.Refused).Scan(&a.UpdatedAt)
}

// do retries or drops quarantined message qid in tx, under a savepoint: a
// message that cannot be redriven (ErrNotRedrivable) or written back (its
// record over the outbox's limit, outbox.ErrMessageTooLarge) is refused,
// whatever it wrote undone, and the batch goes on. Any other error ends the
// batch, whose transaction then changes nothing.
func (a *Action) do(ctx context.Context, tx pgx.Tx, qid int64, parked *outboxadmin.Admin) (outcome, note string, err error) {
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		return "", "", err
	}
	outcome, note, err = a.doIn(ctx, sp, qid, parked)
	if errors.Is(err, ErrNotRedrivable) || errors.Is(err, outbox.ErrMessageTooLarge) {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return "", "", rerr
		}
		return OutcomeRefused, err.Error(), nil
	}
	if err != nil {
		return "", "", err
	}
	return outcome, note, sp.Commit(ctx)
}

func (a *Action) doIn(ctx context.Context, tx pgx.Tx, qid int64, parked *outboxadmin.Admin) (outcome, note string, err error) {
	if a.Selection.Parked {
		return a.doParked(ctx, tx, qid, parked)
	}
	if a.Action == ActionDrop {
		switch q, err := drop(ctx, tx, qid, a.Actor, a.Why); {
		case errors.Is(err, pgx.ErrNoRows):
			return OutcomeSkipped, "already resolved, or gone", nil
		case err != nil:
			return "", "", err
		default:
			return OutcomeDone, fmt.Sprintf("discarded message %s", q.MessageID), nil
		}
	}
	switch res, err := retry(ctx, tx, qid, a.Actor); {
	case errors.Is(err, ErrNotFound):
		return OutcomeSkipped, "gone", nil
	case err != nil:
		return "", "", err
	case !res.Redriven:
		return OutcomeSkipped, res.Note, nil
	default:
		return OutcomeDone, res.Note, nil
	}
}

// doParked retries or drops parked outbox row id in tx.
func (a *Action) doParked(ctx context.Context, tx pgx.Tx, id int64, parked *outboxadmin.Admin) (outcome, note string, err error) {
	if a.Action == ActionDrop {
		err = parked.DropTx(ctx, tx, id, a.Actor, a.Why)
		note = fmt.Sprintf("outbox row %d dropped (outbox_dropped keeps it)", id)
	} else {
		err = parked.RetryTx(ctx, tx, id)
		note = fmt.Sprintf("outbox row %d unparked: the relay sends it again", id)
	}
	switch {
	case errors.Is(err, outboxadmin.ErrNotParked):
		return OutcomeSkipped, "no longer parked", nil
	case err != nil:
		return "", "", err
	}
	return OutcomeDone, note, nil
}

// StopBulk stops action id, by by: RunBulk leaves it (and returns it as it
// stands), and its messages not done yet stay as they are (a new action's
// dry run counts them). It waits for a batch running now to commit. An
// action already finished or stopped is returned as it is.
func (adm *Admin) StopBulk(ctx context.Context, id int64, by string) (Action, error) {
	if strings.TrimSpace(by) == "" {
		return Action{}, errors.New("inbox: StopBulk needs who stops it")
	}
	a, err := scanAction(adm.pool.QueryRow(ctx, `UPDATE inbox_actions SET state = 'stopped', stopped_by = $2, finished_at = now(), updated_at = now()
		WHERE id = $1 AND state = 'running' RETURNING `+actionColumns, id, by))
	if errors.Is(err, pgx.ErrNoRows) {
		return adm.GetAction(ctx, id)
	}
	if err != nil {
		return a, fmt.Errorf("inbox: stopping action %d: %w", id, err)
	}
	return a, nil
}

// recordOne records, in tx, the single-message action of Retry
// or Drop on q.
func recordOne(ctx context.Context, tx pgx.Tx, q Quarantined, action, by, why string) error {
	selection, err := json.Marshal(Selection{Consumer: q.Consumer, IDs: []int64{q.ID}})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `WITH a AS (
			INSERT INTO inbox_actions (consumer, action, actor, why, selection, selected, done, state, finished_at)
			VALUES ($1, $2, $3, $4, $5, 1, 1, 'finished', now()) RETURNING id)
		INSERT INTO inbox_action_items (action_id, quarantine_id, outcome, done_at) SELECT id, $6, 'done', now() FROM a`,
		q.Consumer, action, by, why, selection, q.ID)
	if err != nil {
		return fmt.Errorf("inbox: recording the action: %w", err)
	}
	return nil
}

// ActionFilter selects actions for ListActions.
type ActionFilter struct {
	Consumer string // empty: every consumer
	Running  bool   // only the actions not finished
	Before   int64  // only the actions before this id: the next page
	Limit    int    // defaults to 100
}

// ListActions returns the history, newest first.
func (adm *Admin) ListActions(ctx context.Context, f ActionFilter) ([]Action, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := adm.pool.Query(ctx, `SELECT `+actionColumns+` FROM inbox_actions
		WHERE ($1 = '' OR consumer = $1) AND (NOT $2 OR state = 'running') AND ($3 = 0 OR id < $3)
		ORDER BY id DESC LIMIT $4`, schema.PlanEachTime, f.Consumer, f.Running, f.Before, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing actions: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Action, error) { return scanAction(row) })
	if err != nil {
		return nil, fmt.Errorf("inbox: listing actions: %w", err)
	}
	return list, nil
}

// GetAction returns one action.
func (adm *Admin) GetAction(ctx context.Context, id int64) (Action, error) {
	a, err := scanAction(adm.pool.QueryRow(ctx, `SELECT `+actionColumns+` FROM inbox_actions WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, fmt.Errorf("%w: %d", ErrNoAction, id)
	}
	if err != nil {
		return a, fmt.Errorf("inbox: reading action %d: %w", id, err)
	}
	return a, nil
}

// ActionItem is what an action did to one message.
type ActionItem struct {
	QuarantineID int64  // the quarantined message's id; an outbox row's for parked rows (Selection.Parked)
	Outcome      string // "" while to do
	Note         string
	DoneAt       *time.Time
}

// ListActionItems returns action id's messages after quarantine id after,
// in id order, up to limit (100 when 0).
func (adm *Admin) ListActionItems(ctx context.Context, id, after int64, limit int) ([]ActionItem, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := adm.pool.Query(ctx, `SELECT quarantine_id, coalesce(outcome, ''), coalesce(note, ''), done_at FROM inbox_action_items
		WHERE action_id = $1 AND quarantine_id > $2 ORDER BY quarantine_id LIMIT $3`, id, after, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing action %d: %w", id, err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ActionItem, error) {
		var it ActionItem
		return it, row.Scan(&it.QuarantineID, &it.Outcome, &it.Note, &it.DoneAt)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: listing action %d: %w", id, err)
	}
	return list, nil
}
