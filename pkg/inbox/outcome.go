package inbox

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Outcome is how a delivery was settled.
type Outcome string

// The outcomes of a delivery.
const (
	Applied      Outcome = "applied"       // handler ran and its transaction committed
	Duplicate    Outcome = "duplicate"     // already applied with the same payload: handler skipped
	Conflict     Outcome = "conflict"      // id already applied with another payload: quarantined
	Invalid      Outcome = "invalid"       // no id, or payload too large: quarantined
	DeadLettered Outcome = "dead_lettered" // handler failed permanently or MaxAttempts times
	Retried      Outcome = "retried"       // handler failed; the message will be tried again
	Parked       Outcome = "parked"        // its key is held (HoldKey): recorded, applied once released
)

// Event describes one settled delivery, or one failed attempt (Retried).
type Event struct {
	Consumer  string
	MessageID string
	Outcome   Outcome
	Attempt   int           // attempts so far, for Retried and DeadLettered
	Reason    string        // why it was quarantined, dead-lettered or retried
	Duration  time.Duration // from delivery to settlement
	// Breaches are the continuity breaches (continuity.go) this delivery
	// showed, committed with it: on Applied, Parked and DeadLettered.
	Breaches []Breach
}

// Stats counts outcomes since the Inbox was created.
type Stats struct {
	Applied, Duplicates, Conflicts, Invalid, DeadLettered, Retries, Parked int64
}

func outcomeIndex(o Outcome) int {
	switch o {
	case Applied:
		return 0
	case Duplicate:
		return 1
	case Conflict:
		return 2
	case Invalid:
		return 3
	case DeadLettered:
		return 4
	case Parked:
		return 6
	default:
		return 5
	}
}

// BreachKind is the kind of a continuity breach.
type BreachKind string

// The kinds of breach. A late message is recorded beside them, not a
// breach of its own: it fills a gap reported before.
const (
	Gap    BreachKind = "gap"
	Rewind BreachKind = "rewind"
	Late   BreachKind = "late"
)

// Breach is one continuity breach, seen on message MessageID: Expected was
// the number due after PreviousID's (the key's last), Got is the number it
// carried.
type Breach struct {
	Consumer   string
	Kind       BreachKind
	Topic      string
	Key        string
	Stream     string
	Expected   int64
	Got        int64
	MessageID  string
	PreviousID string
	DetectedAt time.Time
}

// String says what the breach means, for logs.
func (b Breach) String() string {
	if b.Kind == Late {
		return fmt.Sprintf("late on key %q of %s: number %d came after %d, filling a gap reported before",
			clip(b.Key), b.Topic, b.Got, b.Expected-1)
	}
	if b.Kind == Gap {
		return fmt.Sprintf("gap on key %q of %s: got number %d, %d expected; %d of the key's messages never arrived (after %s)",
			clip(b.Key), b.Topic, b.Got, b.Expected, b.Got-b.Expected, b.PreviousID)
	}
	return fmt.Sprintf("rewind on key %q of %s: got number %d again under an id never seen, %d expected; the producer's history went back (after %s)",
		clip(b.Key), b.Topic, b.Got, b.Expected, b.PreviousID)
}

// clip shortens s for a reason, at a character boundary: a hostile key or
// type may be long.
func clip(s string) string {
	const max = 120
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
