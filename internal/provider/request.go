package provider

// Reading and checking a POST /v1/captures body, strictly: anything the
// provider would have to guess about is refused with 400 and a reason, and
// nothing refused here is stored under its idempotency key.

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"unicode"
	"unicode/utf8"
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
	if !utf8.Valid(body) {
		return req, invalid("", "body is not valid UTF-8")
	}
	if err := checkObject(body); err != nil {
		return req, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return req, invalid(typeErr.Field, "%s: want %s, got JSON %s", typeErr.Field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
		}
		return req, invalid("", "body: %v", err)
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

// checkObject checks that body is exactly one JSON object whose keys are
// not repeated: encoding/json would keep the last of two "amount"s, and a
// fingerprint of what it kept would hide the other.
func checkObject(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return invalid("", "body must be a JSON object: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return invalid("", "body must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalid("", "body: %v", err)
		}
		key := tok.(string) // object keys are strings, or Token failed
		if seen[key] {
			return invalid(key, "field %q appears twice", truncate(key))
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return invalid(key, "body: %v", err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return invalid("", "body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("", "body: data after the JSON object")
	}
	return nil
}

// fingerprint identifies a request for its idempotency key: the method,
// the path and the body re-encoded from the parsed fields, so that spacing
// and field order do not count and every parameter does.
func fingerprint(method, path string, req CaptureRequest) []byte {
	canonical, _ := json.Marshal(req) // a struct of strings and ints: cannot fail
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

func jsonKind(goKind string) string {
	switch goKind {
	case "int64":
		return "an integer"
	case "string":
		return "a string"
	}
	return goKind
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
