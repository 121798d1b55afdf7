package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/outboxref/outbox-inbox/pkg/internal/permanent"
)

// Permanent wraps err so the middleware dead-letters the message at once
// instead of retrying it: malformed JSON, an unknown schema version, a
// reference to something that does not exist. It is the outbox's
// outbox.Permanent too: one kind, a failure that trying again cannot fix.
func Permanent(err error) error { return permanent.Wrap(err) }

// IsPermanent reports whether err was wrapped by Permanent (or by
// outbox.Permanent).
func IsPermanent(err error) bool { return permanent.Is(err) }

// maxTransientFailures is how many database failures in a row under the
// handler one delivery absorbs before the next one counts as a failed
// attempt.
const maxTransientFailures = 10

// transientError is a database failure under the handler (see transient).
type transientError struct{ err error }

func (e transientError) Error() string {
	return "inbox: database failed under the handler: " + e.err.Error()
}

func (e transientError) Unwrap() error { return e.err }

// transient reports whether a handler error says the database failed, not
// the handler: the connection is gone, the server is restarting or shutting
// down, it ran out of resources, it is a replica now (a failover), a
// serialization failure or deadlock, or the attempt timed out. Such failures are not the message's fault: they do not
// count towards MaxAttempts, and the message is redelivered instead, so a
// Postgres restart never dead-letters good messages.
func transient(tx pgx.Tx, err error) bool {
	if tx.Conn().IsClosed() {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "57014" { // query_canceled: the handler's statement timed out
			return false
		}
		switch pgErr.Code[:2] {
		case "08", "40", "53", "57":
			return true
		}
		// read_only_sql_transaction: the transaction reached a primary that
		// a failover has since made a replica.
		return pgErr.Code == "25006"
	}
	return pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) || pgconn.SafeToRetry(err)
}

// commitRefused reports whether the server refused the COMMIT because of what
// the handler's transaction did: a deferred constraint failed, or a statement
// had failed and the handler went on (pgx.ErrTxCommitRollback). Nothing was
// committed. The attempt counts as failed, like a handler error, so it is
// retried and finally dead-lettered; returned to the broker it would come back
// forever and block its partition. Database failures (transient) still go
// back to the broker.
func commitRefused(tx pgx.Tx, err error) bool {
	var pgErr *pgconn.PgError
	return (errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxCommitRollback)) && !transient(tx, err)
}

// handlerFailed is a set-based batch's error when its BatchFunc failed it.
type handlerFailed struct{ err error }

func (h handlerFailed) Error() string { return h.err.Error() }

func (h handlerFailed) Unwrap() error { return h.err }
