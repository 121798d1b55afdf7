// Package provider is a payment provider stand-in for the reference
// system: a process of its own (cmd/provider) with its own Postgres
// database, whose POST /v1/captures and POST /v1/refunds behave like the
// idempotent requests of Stripe-like APIs, and which fails the way real
// ones do.
//
// The guarantee: for one Idempotency-Key, at most one capture attempt or
// refund is ever executed and recorded while the key lives (KeyTTL, 24h by
// default), whatever the concurrency, the injected faults or a crash of
// the provider; every later request with the key and the same body gets
// the stored response (status and body byte for byte, with
// Idempotent-Replayed: true), one with another body (or another path: keys
// are global) gets 422, one that arrives while the first is executing gets
// 409 idempotency_key_in_use. A request without a key is executed anew
// every time.
//
// Refunds: a capture's refunds never sum to more than its amount, under
// any number of keys at once (its row is locked while one is decided). A
// refund's executed refusals (404 resource_missing, 400
// capture_not_refundable, charge_already_refunded, amount_too_large) are
// stored under the key like a refund, so a retry gets the same answer.
// Every POST needs the API token when the provider has one (HTTP_TOKEN).
//
// The faults, each drawn per POST from a seeded generator (Config): a 500
// before anything is done or stored (a retry runs afresh), latency while
// the key is held, and the lost response: executed and committed, then the
// connection closed unanswered, the provider's half of the crash window
// "effect done, record not written" that the caller must close by retrying
// with the same key. GET /v1/ledger lists every capture attempt for a
// checker; GET /v1/refunds?capture= or ?reference= a capture's or an
// order's refunds.
//
// What is copied from Stripe, and what is not, is in the README section
// "The payment provider stand-in".
package provider
