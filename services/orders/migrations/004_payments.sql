-- Capturing the payment once the stock is reserved (payment.go). The
-- customer's card was authorized when the order was paid; the money is
-- captured when inventory reserves the order, through pkg/effect with the
-- idempotency key capture-<order id>. payment is NULL until then, then
-- 'capturing' (the intent is committed with the reservation), then
-- 'captured' (the provider's capture id in capture_id), 'declined' (the
-- provider refused the card for good) or 'failed' (the request can never
-- succeed), each with its reason in payment_error: a state a person can
-- see and act on, never a retry loop.
ALTER TABLE orders
    ADD COLUMN amount        bigint,
    ADD COLUMN card          text NOT NULL DEFAULT 'tok_visa',
    ADD COLUMN payment       text CHECK (payment IN ('capturing', 'captured', 'declined', 'failed')),
    ADD COLUMN capture_id    text,
    ADD COLUMN payment_error text,
    ADD COLUMN payment_at    timestamptz;
