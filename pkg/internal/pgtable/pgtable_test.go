package pgtable

import (
	"testing"
	"time"
)

// TestFloorTo: intervals start at multiples of the interval since the
// Unix epoch, before it too (where % rounds towards zero).
func TestFloorTo(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		t        string
		interval time.Duration
		want     string
	}{
		{"2026-11-26T17:59:59.999Z", time.Hour, "2026-11-26T17:00:00Z"},
		{"2026-11-26T18:00:00Z", time.Hour, "2026-11-26T18:00:00Z"},
		{"2026-11-26T18:00:00+02:00", 24 * time.Hour, "2026-11-26T00:00:00Z"},
		{"1969-12-31T23:30:00Z", time.Hour, "1969-12-31T23:00:00Z"},
		{"1969-12-31T23:00:00Z", time.Hour, "1969-12-31T23:00:00Z"},
	} {
		if got := FloorTo(at(c.t), c.interval); !got.Equal(at(c.want)) || got.Location() != time.UTC {
			t.Errorf("FloorTo(%s, %s) = %s, want %s UTC", c.t, c.interval, got, c.want)
		}
	}
}
