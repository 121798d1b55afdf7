package inbox

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/pkg/failpoint"
)

// attempt runs one delivery in a transaction of its own: the inbox row, the
// applier, the commit. herr is the handler's error (rolled back); err is an
// infrastructure error (the outcome is unknown or nothing ran).
func (in *Inbox) attempt(d *delivery, a applier) (herr, err error) {
	ctx, cancel := in.txContext(d)
	defer cancel()
	// Read committed, whatever the database's default: a concurrent
	// duplicate then waits for the first delivery's inbox row instead of
	// failing with a serialization error.
	tx, err := in.cfg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	if !in.cfg.disableDedupe {
		// The inbox row, as its key's policy writes it (hold.go): a copy
		// seen before, or a message of a held key (parked), is settled and
		// committed there.
		if fresh, err := in.keys.admit(ctx, tx, d); err != nil || !fresh {
			return nil, err
		}
		failpoint.Hit(failpoint.AfterInboxInsert, d.id)
	}

	if d.attempts > 0 {
		// Cleared before the handler runs, while the transaction is sure to be
		// healthy (a handler that swallowed a failed statement leaves it
		// aborted); a failed attempt rolls the deletion back with the rest.
		if _, err := tx.Exec(ctx, `DELETE FROM inbox_attempts WHERE consumer = $1 AND message_id = $2`, in.cfg.Consumer, d.id); err != nil {
			return nil, fmt.Errorf("inbox: clearing attempts: %w", err)
		}
	}
	if herr := a.apply(ctx, tx, []*message.Message{d.msg}); herr != nil {
		// The deferred rollback undoes the inbox row and every domain write.
		if transient(tx, herr) {
			return nil, transientError{herr}
		}
		return herr, nil
	}
	failpoint.Hit(failpoint.AfterHandlerBeforeCommit, d.id)
	if err := tx.Commit(ctx); err != nil {
		if commitRefused(tx, err) {
			return fmt.Errorf("commit refused: %w", err), nil
		}
		return nil, fmt.Errorf("inbox: commit: %w", err)
	}
	in.settle(d, Applied, "")
	return nil, nil
}
