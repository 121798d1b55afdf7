package inbox

import (
	"fmt"
	"slices"
)

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
