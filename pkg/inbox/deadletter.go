package inbox

import (
	"fmt"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// The kinds of quarantined message (inbox_quarantine.kind).
const (
	KindDeadLetter      = "dead_letter"      // the handler failed permanently or MaxAttempts times
	KindPayloadConflict = "payload_conflict" // an id already applied arrived with another payload
	KindInvalid         = "invalid"          // no message id, or a payload over the size limit
)

// Metadata that a redrive (inboxadmin.Admin.Retry) adds to the message it
// writes back.
const (
	RedriveOfMetadata = "inbox_redrive_of" // the inbox_quarantine id that was redriven
	RedriveByMetadata = "inbox_redrive_by" // who redrove it
	// RedriveTopicMetadata is the topic a redrive's copy came from, set
	// when it is written to the consumer's RedriveTopic. Read only from
	// that topic, which only the consumer writes.
	RedriveTopicMetadata = "inbox_redrive_topic"
	// ReleaseOfMetadata is set, instead, on the parked message a drop
	// (inboxadmin.Admin.Drop) writes back in the place of the dead letter that held its key: the
	// inbox_quarantine id that was discarded.
	ReleaseOfMetadata = "inbox_release_of"
)

// PayloadOmittedMetadata is set on a dead letter whose payload (or whose
// original metadata too) was left out because, with the dead letter's
// headers, it would pass the producer's limit: the row would be one no
// broker takes. It says what was left out; inbox_quarantine keeps all of it.
const PayloadOmittedMetadata = "dead_letter_payload_omitted"

// deadLetterRoom is what the dead letter leaves for the metadata PublishTx
// adds (the write time and a trace context take ~150 bytes).
const deadLetterRoom = 1024

// maxDeadLetterReasonBytes bounds the dead_letter_reason header. A reason
// is the handler's error, which may quote the record (escaped, a byte of it
// can take four): unbounded, it could make the dead letter larger than any
// record, PublishTx refused it on every redelivery, and the message blocked
// its partition. inbox_quarantine keeps the whole reason.
const maxDeadLetterReasonBytes = 4096

// clipReason returns reason as text, cut at a character boundary to at most
// maxDeadLetterReasonBytes, saying so when it was cut.
func clipReason(reason string) string {
	reason = schema.Text(reason)
	if len(reason) <= maxDeadLetterReasonBytes {
		return reason
	}
	cut := maxDeadLetterReasonBytes
	for cut > 0 && !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes in all; inbox_quarantine keeps the whole reason)", reason[:cut], len(reason))
}

// deadLetterMessage is the message published to the dead-letter topic: the
// original payload and metadata, plus the dead_letter_* headers (the reason
// clipped to maxDeadLetterReasonBytes). When that would not fit
// outbox.DefaultMaxMessageBytes, the payload is left out, and then the
// original metadata, and PayloadOmittedMetadata says so. A record that had
// no value goes out with an empty one, as the outbox writes every payload;
// inbox_quarantine keeps the difference (a NULL payload).
func deadLetterMessage(d *delivery, consumer string, attempts int, reason string) *message.Message {
	headers := message.Metadata{
		"dead_letter_reason":     clipReason(reason),
		"dead_letter_consumer":   consumer,
		"dead_letter_message_id": d.id,
		"dead_letter_topic":      d.topic,
		"dead_letter_attempts":   fmt.Sprint(attempts),
	}
	build := func(payload []byte, original message.Metadata) *message.Message {
		dlq := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
		for k, v := range original {
			dlq.Metadata.Set(schema.Text(k), schema.Text(v))
		}
		for k, v := range headers {
			dlq.Metadata.Set(k, v)
		}
		return dlq
	}
	fits := func(m *message.Message) bool {
		return outbox.RecordBytes(m)+deadLetterRoom <= outbox.DefaultMaxMessageBytes
	}
	if dlq := build(d.msg.Payload, d.msg.Metadata); fits(dlq) {
		return dlq
	}
	kept := "inbox_quarantine keeps it (inboxctl show)"
	headers[PayloadOmittedMetadata] = fmt.Sprintf("payload of %d bytes left out: too large for a dead letter; %s", len(d.msg.Payload), kept)
	if dlq := build(nil, d.msg.Metadata); fits(dlq) {
		return dlq
	}
	headers[PayloadOmittedMetadata] = fmt.Sprintf("payload of %d bytes and %d metadata entries left out: too large for a dead letter; %s",
		len(d.msg.Payload), len(d.msg.Metadata), kept)
	return build(nil, nil)
}
