package events

import (
	"errors"
	"testing"
)

func TestDecodeRoundTrip(t *testing.T) {
	in := OrderPaid{Envelope: NewEnvelope(TypeOrderPaid, "o-1"), Lines: []Line{{SKU: "sku-01", Quantity: 2}}}
	payload, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	paid, ok := out.(*OrderPaid)
	if !ok || paid.OrderID != "o-1" || len(paid.Lines) != 1 || paid.Lines[0] != in.Lines[0] {
		t.Fatalf("decoded %#v, want %#v", out, in)
	}
}

func TestDecodeRefusesHostileInput(t *testing.T) {
	for name, payload := range map[string]string{
		"malformed":        `{"schema_version":1,"type":"OrderPaid","order_id":`,
		"unknown version":  `{"schema_version":2,"type":"OrderPaid","order_id":"o","lines":[{"sku":"s","quantity":1}]}`,
		"no version":       `{"type":"OrderPaid","order_id":"o","lines":[{"sku":"s","quantity":1}]}`,
		"unknown type":     `{"schema_version":1,"type":"OrderShipped","order_id":"o"}`,
		"no order":         `{"schema_version":1,"type":"OrderPaid","lines":[{"sku":"s","quantity":1}]}`,
		"wrong types":      `{"schema_version":1,"type":"OrderPaid","order_id":"o","lines":"many"}`,
		"unknown field":    `{"schema_version":1,"type":"OrderPaid","order_id":"o","lines":[{"sku":"s","quantity":1}],"extra":1}`,
		"no lines":         `{"schema_version":1,"type":"OrderPaid","order_id":"o","lines":[]}`,
		"zero quantity":    `{"schema_version":1,"type":"InventoryReserved","order_id":"o","lines":[{"sku":"s","quantity":0}]}`,
		"rejection reason": `{"schema_version":1,"type":"InventoryRejected","order_id":"o"}`,
	} {
		if _, err := Decode([]byte(payload)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Decode returned %v, want an ErrInvalid", name, err)
		}
	}
}
