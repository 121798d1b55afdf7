-- A declined or failed capture can be retried by a person with another
-- card (POST /orders/{id}/payment/retry). Each attempt is an effect of its
-- own, under its own idempotency key: capture-<order id> for the first,
-- capture-<order id>/<n> after it (events.CaptureKey).
ALTER TABLE orders ADD COLUMN capture_attempt int NOT NULL DEFAULT 1;
