package inbox

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
