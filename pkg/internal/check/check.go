// Package check is how the library's configurations (inbox.Config,
// outbox.RelayConfig, their Partitioning) say what is wrong with them: the
// first invalid field, named as its caller writes it ("inbox:
// Config.MaxAttempts must not be negative (0: the default)").
package check

import (
	"fmt"
	"time"
)

// Fields collects the first failed rule of one configuration.
type Fields struct {
	name string // "inbox: Config"
	err  error
}

// Config starts the checks of the configuration name ("inbox: Config").
func Config(name string) *Fields { return &Fields{name: name} }

// Err is the first rule that failed, or nil.
func (f *Fields) Err() error { return f.err }

// That fails with the message format makes (after the configuration's
// name) when ok is false, unless a rule failed before.
func (f *Fields) That(ok bool, format string, args ...any) {
	if f.err == nil && !ok {
		f.err = fmt.Errorf("%s.%s", f.name, fmt.Sprintf(format, args...))
	}
}

// Also fails with err, a check of a part made elsewhere, unless a rule
// failed before.
func (f *Fields) Also(err error) {
	if f.err == nil {
		f.err = err
	}
}

// Required fails when a required field is not set.
func (f *Fields) Required(field string, set bool) {
	f.That(set, "%s is required", field)
}

// NotNegative fails for a negative value of a field whose zero means its
// default.
func NotNegative[T ~int | ~int64](f *Fields, field string, v T) {
	f.That(v >= 0, "%s must not be negative (0: the default)", field)
}

// AtLeast fails for a value of a field, other than its zero (the default),
// below least.
func AtLeast(f *Fields, field string, v, least time.Duration) {
	f.That(v == 0 || v >= least, "%s must be at least %s (0: the default)", field, least)
}
