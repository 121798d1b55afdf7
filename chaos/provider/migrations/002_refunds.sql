-- Refunds of captures: every refund the provider executed, whether or not
-- the client ever saw the answer. A capture's refunds never sum to more
-- than its amount: POST /v1/refunds locks the capture row (FOR UPDATE),
-- sums its refunds and inserts in one transaction (refunds.go).
CREATE TABLE refunds (
    seq             bigint      GENERATED ALWAYS AS IDENTITY UNIQUE, -- listing order
    id              text        PRIMARY KEY,                         -- re_…
    capture_id      text        NOT NULL REFERENCES captures (id),
    amount          bigint      NOT NULL CHECK (amount > 0),         -- minor units
    currency        text        NOT NULL,                            -- the capture's
    reference       text        NOT NULL,                            -- the capture's: the merchant's order id
    reason          text,
    idempotency_key text,                                            -- NULL: sent without one
    request_id      text        NOT NULL,                            -- req_… of the executing request
    created_at      timestamptz NOT NULL
);
CREATE INDEX refunds_capture_id ON refunds (capture_id);
CREATE INDEX refunds_reference ON refunds (reference, seq);
CREATE INDEX refunds_idempotency_key ON refunds (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- A key of POST /v1/refunds stores its response like one of POST
-- /v1/captures, and links the refund it made here (capture_id stays NULL:
-- it names what a capture request made). An executed refusal (404
-- resource_missing, 400 charge_already_refunded and the others) is stored
-- with both NULL.
ALTER TABLE idempotency_keys ADD COLUMN refund_id text;
