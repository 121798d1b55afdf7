package inbox

import (
	"time"
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

// Stats returns the outcome counters.
func (in *Inbox) Stats() Stats {
	return Stats{
		Applied:      in.stats[0].Load(),
		Duplicates:   in.stats[1].Load(),
		Conflicts:    in.stats[2].Load(),
		Invalid:      in.stats[3].Load(),
		DeadLettered: in.stats[4].Load(),
		Retries:      in.stats[5].Load(),
		Parked:       in.stats[6].Load(),
	}
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
