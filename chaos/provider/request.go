package provider

// Reading and checking a POST /v1/captures or /v1/refunds body, strictly:
// anything the provider would have to guess about is refused with 400 and
// a reason, and nothing refused here is stored under its idempotency key.

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"unicode"

	"github.com/outboxref/outbox-inbox/services/runtime/strictjson"
)

// CaptureRequest is the body of POST /v1/captures.
type CaptureRequest struct {
	Amount    int64  `json:"amount"`    // minor units, 1..MaxAmount
	Currency  string `json:"currency"`  // lowercase ISO 4217, one of Currencies
	Reference string `json:"reference"` // the merchant's order id
	Source    string `json:"source"`    // card token, tok_…
}

// Currencies are the currencies accepted, lowercase as Stripe spells them.
var Currencies = map[string]bool{"eur": true, "usd": true, "gbp": true, "chf": true, "sek": true, "dkk": true, "nok": true, "pln": true}

// DeclinedSources are the card tokens that are always declined (Stripe's
// test token tok_chargeDeclined, and the plainer tok_declined).
var DeclinedSources = map[string]bool{"tok_declined": true, "tok_chargeDeclined": true}

var sourcePattern = regexp.MustCompile(`^tok_[A-Za-z0-9_]{1,250}$`)

// invalidRequest is a 400 with the parameter at fault.
type invalidRequest struct {
	param, msg string
}

func (e *invalidRequest) Error() string { return e.msg }

func invalid(param, format string, args ...any) error {
	return &invalidRequest{param: param, msg: fmt.Sprintf(format, args...)}
}

// parseCaptureRequest decodes and checks body: one JSON object, valid
// UTF-8, no unknown, duplicate or missing fields, no trailing data, the
// amount an integer in range, the currency known, the reference printable,
// the source a token.
func parseCaptureRequest(body []byte) (CaptureRequest, error) {
	var req CaptureRequest
	if _, err := decodeBody(body, &req); err != nil {
		return req, err
	}
	switch {
	case req.Amount <= 0:
		return req, invalid("amount", "amount must be a positive integer of minor units")
	case req.Amount > MaxAmount:
		return req, invalid("amount", "amount must be at most %d", MaxAmount)
	case req.Currency == "":
		return req, invalid("currency", "currency is required")
	case !Currencies[req.Currency]:
		return req, invalid("currency", "currency %q is not supported (lowercase ISO 4217, e.g. eur)", truncate(req.Currency))
	case req.Reference == "":
		return req, invalid("reference", "reference is required")
	case len(req.Reference) > 255:
		return req, invalid("reference", "reference must be at most 255 bytes")
	case !printable(req.Reference):
		return req, invalid("reference", "reference must not contain control characters")
	case req.Source == "":
		return req, invalid("source", "source is required")
	case !sourcePattern.MatchString(req.Source):
		return req, invalid("source", "source must be a card token (tok_ followed by letters, digits or _)")
	}
	return req, nil
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	Capture string `json:"capture"` // cap_…, the capture to refund
	// Amount, in minor units, 1..MaxAmount; absent (nil): all that is
	// left of the capture.
	Amount *int64 `json:"amount,omitempty"`
	Reason string `json:"reason,omitempty"` // at most MaxReasonBytes, printable
}

// MaxReasonBytes bounds a refund's reason.
const MaxReasonBytes = 500

// parseRefundRequest decodes and checks body as parseCaptureRequest does:
// the capture an identifier, the amount, if there, a positive integer in
// range (not null: leave it out for "the rest"), the reason printable.
func parseRefundRequest(body []byte) (RefundRequest, error) {
	var req RefundRequest
	tree, err := decodeBody(body, &req)
	if err != nil {
		return req, err
	}
	if v, ok := tree.Field("amount"); ok && v.Kind == strictjson.Null {
		return req, invalid("amount", "amount must be a positive integer of minor units, or left out to refund all that is left")
	}
	switch {
	case req.Capture == "":
		return req, invalid("capture", "capture is required")
	case !storable(req.Capture):
		return req, invalid("capture", "capture must be printable text of at most 255 bytes")
	case req.Amount != nil && *req.Amount <= 0:
		return req, invalid("amount", "amount must be a positive integer of minor units")
	case req.Amount != nil && *req.Amount > MaxAmount:
		return req, invalid("amount", "amount must be at most %d", MaxAmount)
	case len(req.Reason) > MaxReasonBytes:
		return req, invalid("reason", "reason must be at most %d bytes", MaxReasonBytes)
	case !printable(req.Reason):
		return req, invalid("reason", "reason must not contain control characters")
	}
	return req, nil
}

// decodeBody decodes body into v strictly (strictjson), a refusal as an
// invalidRequest naming the field, and returns the parsed tree.
func decodeBody(body []byte, v any) (*strictjson.Value, error) {
	tree, err := strictjson.Parse(body)
	if err == nil {
		err = tree.Decode(v)
	}
	if err != nil {
		var refused *strictjson.Error
		if errors.As(err, &refused) {
			return nil, invalid(refused.Path, "%v", refused)
		}
		return nil, invalid("", "body: %v", err)
	}
	return tree, nil
}

// fingerprint identifies a request for its idempotency key: the method,
// the path and the body re-encoded from the parsed fields (req, a
// CaptureRequest or a RefundRequest), so that spacing and field order do
// not count and every parameter does.
func fingerprint(method, path string, req any) []byte {
	canonical, err := json.Marshal(req)
	if err != nil {
		panic(fmt.Sprintf("provider: fingerprint %T: %v", req, err)) // only our own request types come here
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, path)
	h.Write(canonical)
	return h.Sum(nil)
}

func printable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// validKey reports whether an Idempotency-Key is 1..MaxKeyLength bytes of
// printable ASCII.
func validKey(k string) error {
	switch {
	case k == "":
		return invalid("Idempotency-Key", "Idempotency-Key must not be empty")
	case len(k) > MaxKeyLength:
		return invalid("Idempotency-Key", "Idempotency-Key must be at most %d characters", MaxKeyLength)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return invalid("Idempotency-Key", "Idempotency-Key must be printable ASCII")
		}
	}
	return nil
}

// truncate shortens what a client sent before it is echoed in an error.
func truncate(s string) string {
	for i := range s { // at a rune's start
		if i >= 40 {
			return s[:i] + "…"
		}
	}
	return s
}
