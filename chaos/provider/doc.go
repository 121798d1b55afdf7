// Package provider is a payment provider stand-in for the reference
// system: a process of its own (cmd/provider) with its own Postgres
// database, whose POST /v1/captures behaves like the idempotent requests of
// Stripe-like APIs, and which fails the way real ones do.
//
// The guarantee: for one Idempotency-Key, at most one capture attempt is
// ever executed and recorded while the key lives (KeyTTL, 24h by default),
// whatever the concurrency, the injected faults or a crash of the
// provider; every later request with the key and the same body gets the
// stored response (status and body byte for byte, with Idempotent-Replayed:
// true), one with another body gets 422, one that arrives while the first
// is executing gets 409 idempotency_key_in_use. A request without a key is
// a new capture every time.
//
// The faults, each drawn per POST from a seeded generator (Config): a 500
// before anything is done or stored (a retry runs afresh), latency while
// the key is held, and the lost response: executed and committed, then the
// connection closed unanswered, the provider's half of the crash window
// "effect done, record not written" that the caller must close by retrying
// with the same key. GET /v1/ledger lists every attempt for a checker.
//
// What is copied from Stripe, and what is not, is in the README section
// "The payment provider stand-in".
package provider
