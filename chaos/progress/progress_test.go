package progress

import (
	"testing"
	"time"
)

func TestLeft(t *testing.T) {
	for _, c := range []struct {
		done, total int
		elapsed     time.Duration
		want        string
	}{
		{0, 10, time.Minute, ""},
		{10, 10, time.Minute, ""},
		{1, 4, 10 * time.Second, ", ~30s left"},
		{300, 1000, 15 * time.Second, ", ~35s left"},
	} {
		if got := Left(c.done, c.total, c.elapsed); got != c.want {
			t.Errorf("Left(%d, %d, %s) = %q, want %q", c.done, c.total, c.elapsed, got, c.want)
		}
	}
}
