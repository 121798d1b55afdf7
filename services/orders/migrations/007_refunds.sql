-- Refunding a captured payment (refund.go): the order ends rejected, with
-- the reason; its payment moves from 'captured' to 'refunding' (the refund
-- is recorded as an effect in the same transaction, key refund-<order id>)
-- and then to 'refunded' (the provider's refund id in refund_id) or
-- 'refund_failed' (the provider refused it for good: payment_error says
-- why, a person acts on it). refund_at is when the refund was asked for.
ALTER TABLE orders DROP CONSTRAINT orders_payment_check;
ALTER TABLE orders ADD CONSTRAINT orders_payment_check
    CHECK (payment IN ('capturing', 'captured', 'declined', 'failed', 'refunding', 'refunded', 'refund_failed'));
ALTER TABLE orders
    ADD COLUMN refund_id text,
    ADD COLUMN refund_at timestamptz;
-- The auditor (services/auditor) follows each refund to its end by
-- (refund_at, id): set once, when the refund is asked for.
CREATE INDEX IF NOT EXISTS orders_refund ON orders (refund_at, id) WHERE refund_at IS NOT NULL;
