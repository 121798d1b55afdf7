// Package events holds the messages orders and inventory exchange: versioned
// JSON, one Go type per event, shared by both services (and by nothing in
// pkg/, which knows no business).
//
// Every event is published with the order id as its Kafka key, so all events
// of one order stay on one partition, in order.
package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// SchemaVersion is the version this code writes and the only one it reads.
const SchemaVersion = 1

// Topics.
const (
	// TopicOrders carries OrderPaid, from orders to inventory.
	TopicOrders = "orders.events"
	// TopicInventory carries InventoryReserved and InventoryRejected, from
	// inventory to orders.
	TopicInventory = "inventory.events"
)

// Event types, in the "type" field of every event.
const (
	TypeOrderPaid         = "OrderPaid"
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
// type, a missing field.
var ErrInvalid = errors.New("invalid event")

// Decode reads an event strictly: unknown fields, wrong types, another
// schema version or an unexpected type are errors wrapping ErrInvalid. It
// returns one of *OrderPaid, *InventoryReserved, *InventoryRejected.
func Decode(payload []byte) (any, error) {
	var env Envelope
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if env.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("%w: schema_version %d, this consumer reads %d", ErrInvalid, env.SchemaVersion, SchemaVersion)
	}
	if env.OrderID == "" {
		return nil, fmt.Errorf("%w: %s without order_id", ErrInvalid, env.Type)
	}
	var ev interface{ validate() error }
	switch env.Type {
	case TypeOrderPaid:
		ev = &OrderPaid{}
	case TypeInventoryReserved:
		ev = &InventoryReserved{}
	case TypeInventoryRejected:
		ev = &InventoryRejected{}
	default:
		return nil, fmt.Errorf("%w: unknown type %q", ErrInvalid, env.Type)
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(ev); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, env.Type, err)
	}
	if err := ev.validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, env.Type, err)
	}
	return ev, nil
}

func validateLines(lines []Line) error {
	if len(lines) == 0 {
		return errors.New("no lines")
	}
	for _, l := range lines {
		if l.SKU == "" || l.Quantity <= 0 {
			return fmt.Errorf("line %+v: want a sku and a positive quantity", l)
		}
	}
	return nil
}

func (e *OrderPaid) validate() error         { return validateLines(e.Lines) }
func (e *InventoryReserved) validate() error { return validateLines(e.Lines) }
func (e *InventoryRejected) validate() error {
	if e.Reason == "" {
		return errors.New("no reason")
	}
	return nil
}

// Encode marshals an event.
func Encode(ev any) ([]byte, error) { return json.Marshal(ev) }
