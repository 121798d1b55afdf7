//go:build !failpoint

package failpoint

// Enabled reports whether this binary was built with the failpoint tag: only
// then can a window fire.
const Enabled = false

// FromEnv does nothing in a default build: FAILPOINTS and its companions
// are not read, and no window can fire.
func FromEnv() error { return nil }

// Hit does nothing in a default build (see the package doc); the compiler
// removes the call.
func Hit(Name, string) {}
