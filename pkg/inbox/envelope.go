package inbox

import (
	"fmt"
	"slices"
	"unicode/utf8"
)

// Envelope is what a message's payload says about the record that carries
// it, for Config.Envelope. A field left empty is not compared.
//
// A record's envelope (its partition key, the topic it travels on, a type
// header, its id) decides where it goes and what the inbox and the
// consumer's checks look at: the key its partition and order, and what
// HoldKey holds; the topic who consumes it; the id what it is deduplicated
// by. Its payload decides what the handler does. Where the two disagree,
// the checks look at one entity and the handler changes another: an event
// for order B under order A's key is ordered among A's events, not B's,
// and parked with A's. A signature does not help (it proves who wrote the
// record, and a producer with a bug signs its bug), so the inbox compares
// them.
type Envelope struct {
	// Key is the partition key the payload belongs under (the entity it
	// concerns), compared with the record's (Config.Key).
	Key string
	// Topics are the topics a message of its type may travel on, compared
	// with the topic it was read from (where the router says which).
	Topics []string
	// Type is the payload's type, compared with the record's type header
	// (Config.TypeHeader) where it carries one.
	Type string
	// ID is the message id the payload names, compared with the id the
	// inbox deduplicates by (Config.MessageID).
	ID string
}

// disagreement compares the record d carries with what its payload says,
// and returns the first disagreement, or "".
func (in *Inbox) disagreement(d *delivery) string {
	env, ok := in.cfg.Envelope(d.msg)
	if !ok {
		return "" // the handler refuses what it cannot read
	}
	const lead = "the record disagrees with its payload: "
	if env.Key != "" {
		if key := in.cfg.Key(d.msg); key != env.Key {
			return fmt.Sprintf(lead+"partition key %q, the payload's is %q", clip(key), clip(env.Key))
		}
	}
	if len(env.Topics) > 0 && d.topic != "" && !slices.Contains(env.Topics, d.topic) {
		if env.Type != "" {
			return fmt.Sprintf(lead+"read from topic %q, its type %q travels on %q", d.topic, clip(env.Type), env.Topics)
		}
		return fmt.Sprintf(lead+"read from topic %q, it travels on %q", d.topic, env.Topics)
	}
	if env.Type != "" {
		if typ := d.msg.Metadata.Get(in.cfg.TypeHeader); typ != "" && typ != env.Type {
			return fmt.Sprintf(lead+"type header %q, the payload's type is %q", clip(typ), clip(env.Type))
		}
	}
	if env.ID != "" && env.ID != d.id {
		return fmt.Sprintf(lead+"message id %q, the payload's is %q", clip(d.id), clip(env.ID))
	}
	return ""
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
