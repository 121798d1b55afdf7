//go:build !failpoint

package failpoint

// Enabled reports whether this binary was built with the failpoint tag: only
// then can a window fire.
const Enabled = false

// FromEnv does nothing in a default build: FAILPOINTS and its companions
// are not read, and no window can fire.
func FromEnv() error { return nil }

// No window is armed or traced in a default build: Hit returns at once, and
// the compiler removes the call (see the package doc).
func active() bool     { return false }
func hit(Name, string) {}
