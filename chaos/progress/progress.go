// Package progress words the time left of a long run (the chaos harness's
// load, the benchmark's steps) for its progress lines.
package progress

import (
	"fmt"
	"time"
)

// Left estimates, from done of total in elapsed, the time the rest takes at
// the same pace: ", ~42s left"; "" when nothing or everything is done.
func Left(done, total int, elapsed time.Duration) string {
	if done <= 0 || done >= total {
		return ""
	}
	left := time.Duration(float64(elapsed) / float64(done) * float64(total-done))
	return fmt.Sprintf(", ~%s left", left.Round(time.Second))
}
