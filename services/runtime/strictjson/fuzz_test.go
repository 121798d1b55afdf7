package strictjson_test

import (
	"encoding/json"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/strictjson"
)

// The second reader: the JSON v2 prototype (github.com/go-json-experiment),
// an implementation that shares no code with this package, set to be
// strict: it refuses duplicate names and invalid UTF-8 and matches names
// case-sensitively by default; unknown members too with this option.
func readV2(data []byte, v any) error {
	return jsonv2.Unmarshal(data, v, jsonv2.RejectUnknownMembers(true))
}

// request is the shape of the orders API's POST /orders body.
type request struct {
	Lines []events.Line `json:"lines"`
	Card  string        `json:"card,omitempty"`
}

// agree checks the two properties the fuzz targets hold every input to:
// whatever strictjson accepts the second reader accepts too (strictjson is
// never the looser), and where both accept they read the same value.
func agree[T any](t *testing.T, data []byte) {
	var strict, other T
	errStrict, errOther := strictjson.Decode(data, &strict), readV2(data, &other)
	if errStrict != nil {
		return
	}
	if errOther != nil {
		t.Fatalf("strictjson accepted what the second reader refuses (%v):\n%q", errOther, data)
	}
	a, err := json.Marshal(strict)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(other)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) {
		t.Fatalf("the two readers disagree on\n%q\nstrictjson: %s\nsecond:     %s", data, a, b)
	}
}

// seeds are valid inputs and one of each hostile class.
var seeds = []string{
	`{"schema_version":1,"type":"OrderPaid","order_id":"0190a7c4-0000-7000-8000-000000000001","lines":[{"sku":"sku-01","quantity":2}],"paid_at":"2026-01-02T03:04:05Z"}`,
	`{"schema_version":1,"type":"InventoryRejected","order_id":"0190a7c4-0000-7000-8000-000000000001","reason":"insufficient stock: a\u00e9\ud83d\ude00"}`,
	`{"lines":[{"sku":"a","quantity":1},{"sku":"b","quantity":3}],"card":"tok_visa"}`,
	`{"lines":[{"sku":"a","quantity":1}]}`,
	`{"order_id":"a","order_id":"b"}`,
	`{"Order_ID":"a"}`,
	`{"lines":[]} {"lines":[]}`,
	`{"reason":"\ud800"}`,
	`{"reason":"\udc00\ud800"}`,
	"{\"reason\":\"\xff\"}",
	`{"lines":null}`,
	`{"lines":[{"sku":"a","quantity":1.0}]}`,
	`{"lines":[{"sku":"a","quantity":1e2}]}`,
	`{"lines":[{"sku":"a","quantity":99999999999999999999}]}`,
	`{"lines":[{"sku":"a","quantity":1,"extra":true}]}`,
	`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
	`{"schema_version":1,"type":"OrderPaid","paid_at":"2026-13-02T03:04:05Z"}`,
	"\ufeff{}",
	`{"reason":"a\u0000b"}`,
}

func FuzzOrderPaid(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree[events.OrderPaid](t, data) })
}

func FuzzInventoryRejected(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree[events.InventoryRejected](t, data) })
}

func FuzzOrderRequest(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { agree[request](t, data) })
}
