package inbox

import (
	"fmt"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// redriveCopy is the stage (stages.go) of a consumer with a
// Config.RedriveTopic: a message read from there is a redrive's copy
// (inboxadmin.Admin.Retry), written by this consumer alone, and is the
// message of the topic it came from, which it must name.
func redriveCopy(in *Inbox, d *delivery) string {
	if d.from != in.cfg.RedriveTopic {
		return ""
	}
	switch orig := d.msg.Metadata.Get(RedriveTopicMetadata); {
	case orig == "":
		return fmt.Sprintf("read from the redrive topic %q without the topic it came from (no %s header)", d.from, RedriveTopicMetadata)
	case orig == d.from || orig == in.cfg.DeadLetterTopic || orig != schema.Text(orig):
		return fmt.Sprintf("read from the redrive topic %q, it names %q as the topic it came from", d.from, schema.Text(orig))
	default:
		d.topic = orig
		return ""
	}
}
