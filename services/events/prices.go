package events

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// Currency is the currency of every order.
const Currency = "eur"

// MaxAmount is the largest amount an order may cost, in cents: what the
// payment provider captures at most (eight digits, as Stripe's limit).
const MaxAmount = 99_999_999

// CaptureKey is the idempotency key of an order's payment capture: derived
// from the order, so every call, by any replica, after any crash, carries
// the same one.
func CaptureKey(orderID string) string { return CaptureKeyPrefix + orderID }

// RetryCaptureKey is the key of a person's attempt (2, 3, ...) to capture
// an order's payment again after a decline: a new request, so a new key.
func RetryCaptureKey(orderID string, attempt int) string {
	if attempt <= 1 {
		return CaptureKey(orderID)
	}
	return fmt.Sprintf("%s%s/%d", CaptureKeyPrefix, orderID, attempt)
}

// CaptureOrder returns the order id a capture key was derived from.
func CaptureOrder(key string) string {
	id, _ := parseCaptureKey(key)
	return id
}

// CaptureAttempt returns the attempt a capture key was derived for: 1, or
// the n of a retry's key.
func CaptureAttempt(key string) int {
	_, n := parseCaptureKey(key)
	return n
}

func parseCaptureKey(key string) (orderID string, attempt int) {
	id, n, ok := strings.Cut(strings.TrimPrefix(key, CaptureKeyPrefix), "/")
	attempt = 1
	if ok {
		if a, err := strconv.Atoi(n); err == nil {
			attempt = a
		}
	}
	return id, attempt
}

// CaptureKeyPrefix starts every capture's key.
const CaptureKeyPrefix = "capture-"

// Price is what one unit of sku costs, in cents: between 1.00 and 99.99,
// drawn from the SKU's name. The example has no catalogue; a price that
// follows from the name lets every party (orders, the provider's ledger,
// the chaos checker) agree on an order's amount without sharing a table.
func Price(sku string) int64 {
	h := fnv.New32a()
	h.Write([]byte(sku)) //nolint:errcheck // a hash never fails to write
	return 100 + int64(h.Sum32()%9_900)
}

// Amount is what an order of lines costs, in cents.
func Amount(lines []Line) int64 {
	var sum int64
	for _, l := range lines {
		sum += Price(l.SKU) * int64(l.Quantity)
	}
	return sum
}

// RefundKey is the idempotency key of an order's refund: an order is
// refunded once, whole, so one key per order.
func RefundKey(orderID string) string { return RefundKeyPrefix + orderID }

// RefundKeyPrefix starts every refund's key.
const RefundKeyPrefix = "refund-"
