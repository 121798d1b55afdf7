package inbox

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Deliver is the inbox for a consumer that reads its broker with a client of
// its own instead of Watermill's router (franz-go, Sarama's consumer group,
// confluent-kafka-go): it applies msg, a record of topic, through h exactly
// as the handler [Inbox.Middleware] returns does, in one transaction with
// the inbox row, and returns nil once msg is settled: applied and committed,
// suppressed as a duplicate, quarantined, parked or dead-lettered. Commit
// the record's offset then, and only then. An error means nothing was
// settled (the database could not be reached): leave the offset where it
// is, and deliver msg again.
//
// msg carries what the router would have read from the record: its id
// (msg.UUID, or what Config.MessageID reads), its payload and its headers
// as Metadata. topic is the record's topic: the inbox keys holds, the
// continuity check and redrives on it, so an empty one is refused.
// inboxkafka's Position, Key and Verify read the record from the context
// watermill-kafka's subscriber fills: with a client of your own, give
// Config.Position, Key and Verify functions that read msg (its Metadata)
// or your record.
// One record of a partition at a time, in offset order, as the router
// does: the inbox's order promises (a key's messages, a hold) are the
// partition's order.
func (in *Inbox) Deliver(ctx context.Context, topic string, msg *message.Message, h message.HandlerFunc) error {
	if topic == "" {
		return errors.New("inbox: Deliver needs the record's topic")
	}
	msg.SetContext(context.WithValue(ctx, topicKey{}, topic))
	_, err := in.Middleware(h)(msg)
	return err
}
