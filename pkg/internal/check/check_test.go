package check

import (
	"testing"
	"time"
)

// TestFirstFailedRule: the first rule that fails is the error, named after
// the configuration; rules that pass, or come after, say nothing.
func TestFirstFailedRule(t *testing.T) {
	f := Config("inbox: Config")
	f.Required("Pool", true)
	NotNegative(f, "MaxAttempts", 0)
	AtLeast(f, "PollInterval", 0, time.Millisecond)
	if err := f.Err(); err != nil {
		t.Fatalf("every rule holds, got %v", err)
	}
	AtLeast(f, "PollInterval", time.Microsecond, time.Millisecond)
	NotNegative(f, "MaxAttempts", -1)
	want := "inbox: Config.PollInterval must be at least 1ms (0: the default)"
	if err := f.Err(); err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}

	f = Config("outbox: RelayConfig")
	NotNegative(f, "BatchTimeout", -time.Second)
	if want := "outbox: RelayConfig.BatchTimeout must not be negative (0: the default)"; f.Err() == nil || f.Err().Error() != want {
		t.Fatalf("got %v, want %q", f.Err(), want)
	}
	f = Config("inbox: Config")
	f.Required("Consumer", false)
	if want := "inbox: Config.Consumer is required"; f.Err() == nil || f.Err().Error() != want {
		t.Fatalf("got %v, want %q", f.Err(), want)
	}
}
