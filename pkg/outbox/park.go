package outbox

import (
	"github.com/outboxref/outbox-inbox/pkg/internal/permanent"
)

// Parking. A row the broker will never accept, however often it is sent
// (larger than the producer's or the topic's limit, a record the broker
// calls invalid), is parked by the relay: it stays unpublished with its
// reason, and the rest of its batch is published. The rows after it with
// the same topic and partition key wait behind it, so that a key's messages
// never overtake each other; other keys go on. An operator lists parked
// rows (outboxadmin.Admin.ListParked), and either retries one (Retry: after
// raising the broker's limit, say), which lets its key go on behind it, or
// drops it (Drop), which moves it to outbox_dropped with who and why, and
// lets its key go on without it. Rows with an empty partition key carry no order, so nothing
// waits behind them.

// Permanent wraps err so that the relay's default IsPermanent takes it as a
// refusal of the message itself: a publisher's way to say "never send this
// again" (outboxkafka's Publisher wraps Kafka's refusals in it). It is the
// inbox's inbox.Permanent too: one kind, a failure that trying again cannot
// fix. nil stays nil.
func Permanent(err error) error { return permanent.Wrap(err) }

// IsPermanent reports whether err, from a Publisher, says the broker will
// never take a message of the batch, so that the relay finds that message
// and parks it instead of retrying the batch: whether err was wrapped by
// Permanent (or by inbox.Permanent). Everything else is transient, and the batch is retried after a
// backoff. It is RelayConfig.IsPermanent's default; outboxkafka.IsPermanent
// also knows Sarama's refusals, for a relay publishing through
// watermill-kafka's Publisher.
func IsPermanent(err error) bool { return permanent.Is(err) }
