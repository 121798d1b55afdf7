// Package events holds the messages orders and inventory exchange: versioned
// JSON, one Go type per event, shared by both services (and by nothing in
// pkg/, which knows no business).
//
// Every event is published with the order id as its Kafka key, so all events
// of one order stay on one partition, in order.
package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxref/outbox-inbox/pkg/inbox"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/services/runtime/strictjson"
)

// SchemaVersion is the version this code writes and the only one it reads.
const SchemaVersion = 1

// Topics.
const (
	// TopicOrders carries OrderPaid and then OrderCaptured, from orders to
	// inventory.
	TopicOrders = "orders.events"
	// TopicInventory carries InventoryReserved and InventoryRejected, from
	// inventory to orders.
	TopicInventory = "inventory.events"
)

// OutboxType is the SQL expression of an outbox row's event type: the
// "type" of the JSON its payload column holds. Both services put more than
// one type on their topic, so a query for one type of event names it:
// WHERE topic = $1 AND `+events.OutboxType+` = 'OrderPaid'.
const OutboxType = `convert_from(payload, 'UTF8')::jsonb ->> 'type'`

// Event types, in the "type" field of every event.
const (
	TypeOrderPaid         = "OrderPaid"
	TypeOrderCaptured     = "OrderCaptured"
	TypeInventoryReserved = "InventoryReserved"
	TypeInventoryRejected = "InventoryRejected"
)

// Line is one SKU of an order.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// Envelope holds the fields every event has.
type Envelope struct {
	SchemaVersion int    `json:"schema_version"`
	Type          string `json:"type"`
	OrderID       string `json:"order_id"`
}

// OrderPaid says an order was paid and its stock should be reserved.
type OrderPaid struct {
	Envelope
	Lines  []Line    `json:"lines"`
	PaidAt time.Time `json:"paid_at"`
}

// OrderCaptured says a reserved order's payment was captured: the order
// has ended, sold, and inventory turns its reserved units into sold ones.
type OrderCaptured struct {
	Envelope
	CaptureID string `json:"capture_id"`
}

// InventoryReserved says every line of an order was reserved.
type InventoryReserved struct {
	Envelope
	Lines []Line `json:"lines"`
}

// InventoryRejected says an order could not be reserved; nothing was.
type InventoryRejected struct {
	Envelope
	Reason string `json:"reason"`
}

// NewEnvelope returns the envelope of a new event of type typ.
func NewEnvelope(typ, orderID string) Envelope {
	return Envelope{SchemaVersion: SchemaVersion, Type: typ, OrderID: orderID}
}

// ErrInvalid marks an event that can never be applied, however often it is
// retried: malformed JSON, wrong field types, an unknown schema version or
// type, a missing field, a value outside its domain (see ValidateLines).
var ErrInvalid = errors.New("invalid event")

// Decode reads an event strictly (services/runtime/strictjson): valid UTF-8, one
// JSON object and nothing after it, each of its type's fields exactly once,
// spelled exactly, and no other; no null, no unpaired surrogate; then the
// schema version, the type and every field's domain. Whatever a lenient
// reader would read otherwise (a key twice, a key in another case, a second
// value after the first) is refused, so no two readers of one record can
// disagree on what it says. Every refusal wraps ErrInvalid. It returns one
// of *OrderPaid, *OrderCaptured, *InventoryReserved, *InventoryRejected.
func Decode(payload []byte) (any, error) {
	tree, err := strictjson.Parse(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if tree.Kind != strictjson.Object {
		return nil, fmt.Errorf("%w: want a JSON object, got %s", ErrInvalid, tree.Kind)
	}
	if v, ok := tree.Field("schema_version"); !ok || v.Kind != strictjson.Number || v.Str != fmt.Sprint(SchemaVersion) {
		got := "none"
		if ok {
			got = clip(string(v.Raw))
		}
		return nil, fmt.Errorf("%w: schema_version %s, this consumer reads %d", ErrInvalid, got, SchemaVersion)
	}
	typ, ok := tree.Field("type")
	if !ok || typ.Kind != strictjson.String {
		return nil, fmt.Errorf("%w: no type (a string)", ErrInvalid)
	}
	var ev interface{ validate() error }
	var env *Envelope
	switch typ.Str {
	case TypeOrderPaid:
		e := &OrderPaid{}
		ev, env = e, &e.Envelope
	case TypeOrderCaptured:
		e := &OrderCaptured{}
		ev, env = e, &e.Envelope
	case TypeInventoryReserved:
		e := &InventoryReserved{}
		ev, env = e, &e.Envelope
	case TypeInventoryRejected:
		e := &InventoryRejected{}
		ev, env = e, &e.Envelope
	default:
		return nil, fmt.Errorf("%w: unknown type %q", ErrInvalid, clip(typ.Str))
	}
	if err := tree.Decode(ev); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, typ.Str, err)
	}
	if err := env.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, typ.Str, err)
	}
	if err := ev.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, typ.Str, err)
	}
	return ev, nil
}

// The domain of every field an event or a request carries. A value outside
// it is refused as invalid, whoever sent it: the bounds keep every sum a
// handler computes far from overflowing the int columns it writes.
const (
	MaxLines       = 100     // lines per order
	MaxQuantity    = 10_000  // units of one SKU in one order, summed over its lines
	MaxSKUBytes    = 64      // a SKU's length in bytes
	MaxReasonBytes = 1 << 10 // a rejection reason's length in bytes
	MaxCaptureID   = 128     // a capture id's length in bytes (the provider's id)
)

// ValidateLines checks an order's lines: 1 to MaxLines lines, each a valid
// SKU and a positive quantity, at most MaxQuantity units of any SKU in all.
func ValidateLines(lines []Line) error {
	if len(lines) == 0 {
		return errors.New("no lines: an order needs at least one")
	}
	if len(lines) > MaxLines {
		return fmt.Errorf("%d lines: at most %d per order", len(lines), MaxLines)
	}
	perSKU := map[string]int{}
	for i, l := range lines {
		if err := ValidateSKU(l.SKU); err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		if l.Quantity <= 0 || l.Quantity > MaxQuantity {
			return fmt.Errorf("line %d (%s): quantity %d, want 1 to %d", i+1, l.SKU, l.Quantity, MaxQuantity)
		}
		// Both terms are at most MaxQuantity here: the sum cannot overflow.
		if perSKU[l.SKU] += l.Quantity; perSKU[l.SKU] > MaxQuantity {
			return fmt.Errorf("sku %s: %d units over its lines, at most %d per order", l.SKU, perSKU[l.SKU], MaxQuantity)
		}
	}
	return nil
}

// ValidateSKU checks a SKU: 1 to MaxSKUBytes bytes of valid UTF-8 without
// control characters (NUL among them: Postgres text cannot hold it) or
// surrounding spaces.
func ValidateSKU(sku string) error {
	if err := validText("sku", sku, MaxSKUBytes); err != nil {
		return err
	}
	if strings.TrimSpace(sku) != sku {
		return fmt.Errorf("sku %q has surrounding spaces", sku)
	}
	return nil
}

// ValidateOrderID checks an order id: a UUID in the canonical lowercase form
// the orders service issues (and Postgres prints), nothing else.
func ValidateOrderID(id string) error {
	u, err := uuid.Parse(id)
	if err != nil || u.String() != id {
		return fmt.Errorf("order_id %q is not a UUID in canonical form (like %s)", clip(id), uuid.Nil)
	}
	return nil
}

// validText checks that s is non-empty, valid UTF-8 of at most max bytes,
// without control characters.
func validText(field, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("empty %s", field)
	case len(s) > max:
		return fmt.Errorf("%s of %d bytes, at most %d", field, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %q is not valid UTF-8", field, clip(s))
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s %q holds the control character %U", field, clip(s), r)
		}
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func (e *Envelope) validate() error { return ValidateOrderID(e.OrderID) }

func (e *OrderPaid) validate() error {
	if e.PaidAt.IsZero() {
		return errors.New("no paid_at")
	}
	return ValidateLines(e.Lines)
}

func (e *OrderCaptured) validate() error { return validText("capture_id", e.CaptureID, MaxCaptureID) }

func (e *InventoryReserved) validate() error { return ValidateLines(e.Lines) }

func (e *InventoryRejected) validate() error { return validText("reason", e.Reason, MaxReasonBytes) }

// head returns the envelope of the event that embeds it.
func (e Envelope) head() Envelope { return e }

// Event is any of the four events, by value or by pointer (what Decode
// returns).
type Event interface{ head() Envelope }

// TypeOf names a decoded event's type, for messages.
func TypeOf(ev any) string {
	if e, ok := ev.(Event); ok {
		return e.head().Type
	}
	return fmt.Sprintf("%T", ev)
}

// TopicOf is the topic an event of type typ travels on, or "" for a type
// this package does not know.
func TopicOf(typ string) string {
	switch typ {
	case TypeOrderPaid, TypeOrderCaptured:
		return TopicOrders
	case TypeInventoryReserved, TypeInventoryRejected:
		return TopicInventory
	}
	return ""
}

// Encode marshals an event.
func Encode(ev any) ([]byte, error) { return json.Marshal(ev) }

// Message returns ev as an outbox message: keyed by its order id (every
// event of an order on one partition, in order), its type in the type
// header (outbox.TypeMetadata). The consumer's inbox refuses a record that
// says otherwise than its payload (RecordEnvelope).
func Message(ev Event) (*message.Message, error) {
	payload, err := Encode(ev)
	if err != nil {
		return nil, err
	}
	h := ev.head()
	msg := outbox.NewMessage(h.OrderID, payload)
	msg.Metadata.Set(outbox.TypeMetadata, h.Type)
	return msg, nil
}

// RecordEnvelope is both services' inbox.Config.Envelope: what an event
// says about the record that should carry it. Its order id is the record's
// partition key, its type's topic the topic, its type the type header. A
// record that disagrees (a producer with a bug keyed it under another
// order, sent it on the other topic, or labelled it another type) is
// quarantined before the handler runs: the checks that look at the record
// (ordering per key, HoldKey, the topic's consumer) would otherwise look at
// another order than the one the handler changes. A payload that does not
// decode is left to the handler, which dead-letters it.
//
// The event it decoded rides in msg's context, so the handler does not
// decode the payload again (DecodeMessage).
func RecordEnvelope(msg *message.Message) (inbox.Envelope, bool) {
	ev, err := Decode(msg.Payload)
	if err != nil {
		return inbox.Envelope{}, false
	}
	msg.SetContext(context.WithValue(msg.Context(), decodedKey{}, decoded{payload: msg.Payload, event: ev}))
	h := ev.(Event).head()
	return inbox.Envelope{Key: h.OrderID, Type: h.Type, Topics: []string{TopicOf(h.Type)}}, true
}

// decodedKey carries, in a message's context, the event RecordEnvelope
// decoded from its payload.
type decodedKey struct{}

type decoded struct {
	payload []byte // what it was decoded from
	event   any
}

// DecodeMessage is Decode(msg.Payload), once: the event RecordEnvelope
// decoded for the inbox's envelope check, when it did and the payload is
// still the one it read.
func DecodeMessage(msg *message.Message) (any, error) {
	if d, ok := msg.Context().Value(decodedKey{}).(decoded); ok && bytes.Equal(d.payload, msg.Payload) {
		return d.event, nil
	}
	return Decode(msg.Payload)
}
