package events

import "testing"

// TestCaptureKeys: a capture key names its order and its attempt, and the
// first attempt's key is the plain one.
func TestCaptureKeys(t *testing.T) {
	const id = "01a20c18-5407-76f4-b352-f0e2f08b99ed"
	for _, c := range []struct {
		key     string
		attempt int
	}{
		{CaptureKey(id), 1},
		{RetryCaptureKey(id, 1), 1},
		{RetryCaptureKey(id, 2), 2},
		{RetryCaptureKey(id, 12), 12},
	} {
		if got := CaptureOrder(c.key); got != id {
			t.Errorf("CaptureOrder(%q) = %q, want %q", c.key, got, id)
		}
		if got := CaptureAttempt(c.key); got != c.attempt {
			t.Errorf("CaptureAttempt(%q) = %d, want %d", c.key, got, c.attempt)
		}
	}
	if CaptureKey(id) != "capture-"+id {
		t.Errorf("the first attempt's key changed: %q (keys already recorded would not match)", CaptureKey(id))
	}
}
