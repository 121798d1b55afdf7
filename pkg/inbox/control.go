//go:build failpoint

package inbox

// WithoutDedupe returns c with deduplication switched off: no inbox row is
// written and every delivery runs the handler, however often it comes. It
// exists only in a failpoint build (-tags failpoint), for the chaos
// harness's control run, which must show the double-applies the inbox
// prevents; a default build of the library has no way to switch it off.
func WithoutDedupe(c Config) Config {
	c.disableDedupe = true
	return c
}
