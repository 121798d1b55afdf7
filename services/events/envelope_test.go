package events

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestMessageAgreesWithRecordEnvelope: every event a service writes
// (Message) carries the record its consumer's inbox expects
// (RecordEnvelope): keyed by its order id, its type in the type header,
// on the topic its type travels on. Were they to disagree, the inbox would
// quarantine the services' own events. A payload that does not decode
// says nothing (the handler refuses it).
func TestMessageAgreesWithRecordEnvelope(t *testing.T) {
	const id = "01234567-89ab-7def-8123-456789abcdef"
	lines := []Line{{SKU: "sku-01", Quantity: 1}}
	for _, c := range []struct {
		ev    Event
		topic string
	}{
		{OrderPaid{Envelope: NewEnvelope(TypeOrderPaid, id), Lines: lines, PaidAt: time.Unix(0, 0).UTC()}, TopicOrders},
		{OrderCaptured{Envelope: NewEnvelope(TypeOrderCaptured, id), CaptureID: "cap_1"}, TopicOrders},
		{InventoryReserved{Envelope: NewEnvelope(TypeInventoryReserved, id), Lines: lines}, TopicInventory},
		{InventoryRejected{Envelope: NewEnvelope(TypeInventoryRejected, id), Reason: "none left"}, TopicInventory},
	} {
		typ := TypeOf(c.ev)
		msg, err := Message(c.ev)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		env, ok := RecordEnvelope(msg)
		if !ok {
			t.Fatalf("%s: its own payload says nothing", typ)
		}
		if got := msg.Metadata.Get(outbox.KeyMetadata); got != id || env.Key != id {
			t.Errorf("%s: keyed %q, the payload's key %q, want %q", typ, got, env.Key, id)
		}
		if got := msg.Metadata.Get(outbox.TypeMetadata); got != typ || env.Type != typ {
			t.Errorf("%s: type header %q, the payload's type %q", typ, got, env.Type)
		}
		if len(env.Topics) != 1 || env.Topics[0] != c.topic {
			t.Errorf("%s travels on %v, want [%s]", typ, env.Topics, c.topic)
		}
	}
	if _, ok := RecordEnvelope(message.NewMessage("x", []byte(`{"type":"OrderPaid"`))); ok {
		t.Error("a payload that does not decode said something")
	}
}

// TestDecodeMessageOnce: the handler gets the very event the envelope check
// decoded (no second parse), and a payload changed since is decoded anew.
func TestDecodeMessageOnce(t *testing.T) {
	const id = "01234567-89ab-7def-8123-456789abcdef"
	msg, err := Message(OrderCaptured{Envelope: NewEnvelope(TypeOrderCaptured, id), CaptureID: "cap_1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := RecordEnvelope(msg); !ok {
		t.Fatal("its own payload says nothing")
	}
	first, err := DecodeMessage(msg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := DecodeMessage(msg)
	if err != nil {
		t.Fatal(err)
	}
	if first != again {
		t.Error("DecodeMessage decoded the payload again: the envelope's event was not handed on")
	}

	other, err := Message(OrderCaptured{Envelope: NewEnvelope(TypeOrderCaptured, id), CaptureID: "cap_2"})
	if err != nil {
		t.Fatal(err)
	}
	msg.Payload = other.Payload
	ev, err := DecodeMessage(msg)
	if err != nil {
		t.Fatal(err)
	}
	if got := ev.(*OrderCaptured).CaptureID; got != "cap_2" {
		t.Errorf("a changed payload decoded as %q, want cap_2: the stale event was handed on", got)
	}
}
