// Package permanent is the one error kind the inbox and the outbox share:
// a failure that trying again cannot fix. inbox.Permanent (a handler's:
// dead-letter the message at once) and outbox.Permanent (a broker's: park
// the row) both mark it, and each package's IsPermanent knows both: a
// handler that returns a publisher's permanent refusal is not retried
// either.
package permanent

import "errors"

// marked is an error marked permanent.
type marked struct{ err error }

func (m marked) Error() string { return m.err.Error() }
func (m marked) Unwrap() error { return m.err }

// Wrap marks err permanent; nil stays nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return marked{err}
}

// Is reports whether err, or an error it wraps, was marked by Wrap.
func Is(err error) bool { return errors.As(err, new(marked)) }
