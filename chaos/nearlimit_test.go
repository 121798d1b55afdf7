package main

import (
	"testing"

	"github.com/outboxref/outbox-inbox/pkg/outbox"
)

// TestNearLimitIsNearTheLimit: the near_broker_limit class is what it says,
// a record of nearLimitBytes whose payload is exactly the consumer's limit.
func TestNearLimitIsNearTheLimit(t *testing.T) {
	m := nearLimit("01234567-89ab-7def-8123-456789abcdef")
	msg := m.message() // the record send writes
	if n := outbox.RecordBytes(msg); n != nearLimitBytes || len(m.payload) != 65536 {
		t.Fatalf("record of %d bytes, payload %d; want %d and 65536", n, len(m.payload), nearLimitBytes)
	}
}
