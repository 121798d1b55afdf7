package inbox

import (
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/inbox/internal/schema"
)

// newStages is the ordered list of cfg's stages:
//
//  1. the id, which every stage after it may name (below);
//  2. Config.CheckID: the id in the format its producers issue (verify.go);
//  3. Config.Verify: the record authenticated (verify.go);
//  4. Config.RedriveTopic: a redrive's copy names the topic it came from
//     (redrive.go);
//  5. the key's number, if the producer numbered it (continuity.go);
//  6. Config.Partitions: the id carries a time (partition.go);
//  7. the payload's size;
//  8. Config.Envelope, last, for it reads the payload (envelope.go).
func newStages(cfg Config) []stage {
	stages := []stage{readID}
	if cfg.CheckID != nil {
		stages = append(stages, checkID)
	}
	if cfg.Verify != nil {
		stages = append(stages, verify)
	}
	if cfg.RedriveTopic != "" {
		stages = append(stages, redriveCopy)
	}
	stages = append(stages, numbered)
	if cfg.Partitions != nil {
		stages = append(stages, timeInID)
	}
	stages = append(stages, payloadSize)
	if cfg.Envelope != nil {
		stages = append(stages, (*Inbox).disagreement)
	}
	return stages
}

// readID reads d's id, refusing one the inbox cannot key on: an error of
// Config.MessageID, empty, over maxIDBytes or not valid text; and d's
// partition key, when it can be held (HoldKey).
func readID(in *Inbox, d *delivery) string {
	id, err := in.cfg.MessageID(d.msg)
	switch {
	case err != nil:
		return fmt.Sprintf("reading message id: %v", err)
	case id == "":
		return "message has no id"
	case len(id) > maxIDBytes:
		return fmt.Sprintf("message id of %d bytes exceeds the %d-byte limit", len(id), maxIDBytes)
	case id != schema.Text(id):
		return fmt.Sprintf("message id %q is not valid UTF-8 text", id)
	}
	d.id = id
	if in.cfg.OnDeadLetter == HoldKey {
		d.key = storedKey(in.cfg.Key(d.msg))
	}
	return ""
}

// payloadSize refuses a payload over Config.MaxPayloadBytes.
func payloadSize(in *Inbox, d *delivery) string {
	if len(d.msg.Payload) > in.cfg.MaxPayloadBytes {
		return fmt.Sprintf("payload of %d bytes exceeds the %d-byte limit", len(d.msg.Payload), in.cfg.MaxPayloadBytes)
	}
	return ""
}

// read returns the delivery of msg, and why it must be quarantined unread
// ("" when it can go on): the first refusal of in.stages (stages.go).
func (in *Inbox) read(msg *message.Message) (*delivery, string) {
	topic := topicOf(msg)
	d := &delivery{msg: msg, topic: topic, from: topic, start: time.Now(), sum: sha256.Sum256(msg.Payload)}
	if in.cfg.Position != nil {
		if p, o, ok := in.cfg.Position(msg); ok {
			d.part, d.offset = &p, &o
		}
	}
	for _, check := range in.stages {
		if reason := check(in, d); reason != "" {
			return d, reason
		}
	}
	return d, ""
}
