package events

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const id = "0192f3c4-5d6e-7f80-9a1b-2c3d4e5f6a7b"

func TestDecodeRoundTrip(t *testing.T) {
	in := OrderPaid{Envelope: NewEnvelope(TypeOrderPaid, id), Lines: []Line{{SKU: "sku-01", Quantity: 2}}, PaidAt: time.Now().UTC()}
	payload, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	paid, ok := out.(*OrderPaid)
	if !ok || paid.OrderID != id || len(paid.Lines) != 1 || paid.Lines[0] != in.Lines[0] {
		t.Fatalf("decoded %#v, want %#v", out, in)
	}
}

// paid is an OrderPaid payload with the given order id and lines (JSON).
func paid(orderID, lines string) string {
	return fmt.Sprintf(`{"schema_version":1,"type":"OrderPaid","order_id":%q,"lines":%s,"paid_at":"2026-01-02T03:04:05Z"}`, orderID, lines)
}

func TestDecodeRefusesHostileInput(t *testing.T) {
	many := strings.Repeat(`{"sku":"s","quantity":1},`, MaxLines+1)
	for name, payload := range map[string]string{
		"malformed":        `{"schema_version":1,"type":"OrderPaid","order_id":`,
		"unknown version":  `{"schema_version":2,"type":"OrderPaid","order_id":"` + id + `","lines":[{"sku":"s","quantity":1}]}`,
		"no version":       `{"type":"OrderPaid","order_id":"` + id + `","lines":[{"sku":"s","quantity":1}]}`,
		"unknown type":     `{"schema_version":1,"type":"OrderShipped","order_id":"` + id + `"}`,
		"no order":         `{"schema_version":1,"type":"OrderPaid","lines":[{"sku":"s","quantity":1}]}`,
		"wrong types":      paid(id, `"many"`),
		"unknown field":    `{"schema_version":1,"type":"OrderPaid","order_id":"` + id + `","lines":[{"sku":"s","quantity":1}],"paid_at":"2026-01-02T03:04:05Z","extra":1}`,
		"no lines":         paid(id, `[]`),
		"no paid_at":       `{"schema_version":1,"type":"OrderPaid","order_id":"` + id + `","lines":[{"sku":"s","quantity":1}]}`,
		"zero quantity":    `{"schema_version":1,"type":"InventoryReserved","order_id":"` + id + `","lines":[{"sku":"s","quantity":0}]}`,
		"rejection reason": `{"schema_version":1,"type":"InventoryRejected","order_id":"` + id + `"}`,
		"reason with NUL":  `{"schema_version":1,"type":"InventoryRejected","order_id":"` + id + `","reason":"a\u0000b"}`,
		// Numbers: overflow of int64, of the sum, of int32 once summed.
		"quantity past int64":   paid(id, `[{"sku":"s","quantity":99999999999999999999}]`),
		"quantities that wrap":  paid(id, `[{"sku":"s","quantity":9223372036854775807},{"sku":"s","quantity":9223372036854775807},{"sku":"s","quantity":4}]`),
		"quantity past int32":   paid(id, `[{"sku":"s","quantity":4294967297}]`),
		"sum past the maximum":  paid(id, fmt.Sprintf(`[{"sku":"s","quantity":%d},{"sku":"s","quantity":1}]`, MaxQuantity)),
		"negative quantity":     paid(id, `[{"sku":"s","quantity":-1}]`),
		"fractional quantity":   paid(id, `[{"sku":"s","quantity":1.5}]`),
		"too many lines":        paid(id, `[`+strings.TrimSuffix(many, ",")+`]`),
		"NUL in a SKU":          paid(id, `[{"sku":"s\u0000","quantity":1}]`),
		"control in a SKU":      paid(id, `[{"sku":"s\n1","quantity":1}]`),
		"invalid UTF-8 SKU":     paid(id, "[{\"sku\":\"s\xff\",\"quantity\":1}]"),
		"empty SKU":             paid(id, `[{"sku":"","quantity":1}]`),
		"padded SKU":            paid(id, `[{"sku":" s","quantity":1}]`),
		"long SKU":              paid(id, `[{"sku":"`+strings.Repeat("s", MaxSKUBytes+1)+`","quantity":1}]`),
		"order id not a UUID":   paid("o-1", `[{"sku":"s","quantity":1}]`),
		"order id upper case":   paid(strings.ToUpper(id), `[{"sku":"s","quantity":1}]`),
		"order id with braces":  paid("{"+id+"}", `[{"sku":"s","quantity":1}]`),
		"order id without dash": paid(strings.ReplaceAll(id, "-", ""), `[{"sku":"s","quantity":1}]`),
	} {
		if _, err := Decode([]byte(payload)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Decode returned %v, want an ErrInvalid", name, err)
		}
	}
}

func TestValidateLinesAcceptsTheBounds(t *testing.T) {
	lines := []Line{{SKU: strings.Repeat("s", MaxSKUBytes), Quantity: MaxQuantity}, {SKU: "ü-1", Quantity: 1}}
	for len(lines) < MaxLines {
		lines = append(lines, Line{SKU: fmt.Sprintf("sku-%d", len(lines)), Quantity: 1})
	}
	if err := ValidateLines(lines); err != nil {
		t.Fatal(err)
	}
}
