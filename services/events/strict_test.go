package events_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outbox-inbox/services/events"
)

// TestDecodeRefusesWhatReadsTwoWays: each payload is JSON that encoding/json
// reads one way and a strict reader refuses, or reads another way: a key
// twice (the last wins), a key in another case (matched anyway), a second
// value after the event, an unpaired surrogate (read as U+FFFD), null for a
// field (left as it was), a number written as a float. Decode must refuse
// each with ErrInvalid and say why: the consumer dead-letters it at once.
func TestDecodeRefusesWhatReadsTwoWays(t *testing.T) {
	t.Parallel()
	const a, b = "0190a7c4-0000-7000-8000-000000000001", "0190a7c4-0000-7000-8000-000000000002"
	paid := func(body string) string {
		return `{"schema_version":1,"type":"OrderPaid",` + body + `}`
	}
	lines := `"lines":[{"sku":"sku-01","quantity":1}],"paid_at":"2026-01-02T03:04:05Z"`
	cases := []struct{ name, payload, reason string }{
		{"KeyTwice", paid(`"order_id":"` + a + `","order_id":"` + b + `",` + lines), "order_id: the key appears twice"},
		{"KeyInAnotherCase", paid(`"Order_ID":"` + a + `",` + lines), `Order_ID: unknown field (names are case-sensitive: "order_id")`},
		{"DataAfterTheValue", paid(`"order_id":"`+a+`",`+lines) + ` {"order_id":"` + b + `"}`, "data after the JSON value"},
		{"UnpairedHighSurrogate", paid(`"order_id":"` + a + `","lines":[{"sku":"sku-01\ud800","quantity":1}],"paid_at":"2026-01-02T03:04:05Z"`), `unpaired UTF-16 surrogate \ud800`},
		{"SurrogatesReversed", paid(`"order_id":"` + a + `","lines":[{"sku":"sku\udc00\ud800","quantity":1}],"paid_at":"2026-01-02T03:04:05Z"`), "unpaired UTF-16 surrogate"},
		{"NullField", paid(`"order_id":"` + a + `","lines":null,"paid_at":"2026-01-02T03:04:05Z"`), "lines: null is not an array"},
		{"FloatQuantity", paid(`"order_id":"` + a + `","lines":[{"sku":"sku-01","quantity":1.0}],"paid_at":"2026-01-02T03:04:05Z"`), "lines[0].quantity: want an integer"},
		{"MissingField", paid(`"order_id":"` + a + `","lines":[{"sku":"sku-01","quantity":1}]`), "paid_at: missing"},
		{"MissingLineField", paid(`"order_id":"` + a + `","lines":[{"sku":"sku-01"}],"paid_at":"2026-01-02T03:04:05Z"`), "lines[0].quantity: missing"},
		{"SchemaVersionAsString", `{"schema_version":"1","type":"InventoryRejected","order_id":"` + a + `","reason":"x"}`, `schema_version "1"`},
		{"SchemaVersionAsFloat", `{"schema_version":1.0,"type":"InventoryRejected","order_id":"` + a + `","reason":"x"}`, "schema_version 1.0"},
		{"NotAnObject", `[` + paid(`"order_id":"`+a+`",`+lines) + `]`, "want a JSON object"},
		{"NoValueAtAll", ``, "unexpected end of input"},
		{"Nested", strings.Repeat("[", 100) + strings.Repeat("]", 100), "nested deeper than"},
		{"ControlCharacterInString", paid(`"order_id":"` + a + "\",\"lines\":[{\"sku\":\"sku\x01\",\"quantity\":1}],\"paid_at\":\"2026-01-02T03:04:05Z\""), "control character"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := events.Decode([]byte(c.payload))
			require.Error(t, err)
			require.True(t, errors.Is(err, events.ErrInvalid), "%v", err)
			require.ErrorContains(t, err, c.reason)
		})
	}
	// What they were all made from is an event.
	ev, err := events.Decode([]byte(paid(`"order_id":"` + a + `",` + lines)))
	require.NoError(t, err)
	require.Equal(t, a, ev.(*events.OrderPaid).OrderID)
}
