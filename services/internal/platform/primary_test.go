package platform

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestPrimaryWatch: one line when the primary is lost, one when a primary
// answers again (a failover when it is another server, with the time
// without one), nothing while nothing changes.
func TestPrimaryWatch(t *testing.T) {
	var buf bytes.Buffer
	w := &primaryWatch{log: slog.New(slog.NewTextHandler(&buf, nil))}
	t0 := time.Unix(0, 0)
	up := func(server string) primaryState { return primaryState{server: server} }
	down := primaryState{err: errors.New("dial tcp 127.0.0.1:5432: connection refused")}
	steps := []struct {
		st   primaryState
		at   time.Duration
		want string // the line logged, "" for none
	}{
		{up("pg1:5432"), 0, ""},
		{up("pg1:5432"), time.Second, ""},
		{down, 2 * time.Second, "no primary answers"},
		{down, 3 * time.Second, ""},
		{up("pg2:5432"), 22 * time.Second, "failed over: a new primary answers"},
		{down, 30 * time.Second, "no primary answers"},
		{up("pg2:5432"), 31 * time.Second, "the primary answers again"},
		{up("pg3:5432"), 40 * time.Second, "failed over"},
	}
	for i, s := range steps {
		buf.Reset()
		w.note(s.st, t0.Add(s.at))
		got := buf.String()
		switch {
		case s.want == "" && got != "":
			t.Errorf("step %d: logged %q, want nothing", i, got)
		case s.want != "" && !strings.Contains(got, s.want):
			t.Errorf("step %d: logged %q, want %q", i, got, s.want)
		}
	}
	buf.Reset()
	w.note(down, t0.Add(50*time.Second))
	w.note(up("pg1:5432"), t0.Add(70*time.Second))
	if got := buf.String(); !strings.Contains(got, "was=pg3:5432") || !strings.Contains(got, "without_primary=20s") {
		t.Errorf("the failover line names the old primary and the time without one: %q", got)
	}
}
