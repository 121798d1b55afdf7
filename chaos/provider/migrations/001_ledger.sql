-- The provider's own ledger: every capture attempt it executed, captured or
-- declined, whether or not the client ever saw the answer.
CREATE TABLE captures (
    seq             bigint      GENERATED ALWAYS AS IDENTITY UNIQUE, -- listing order and cursor
    id              text        PRIMARY KEY,                         -- cap_…
    amount          bigint      NOT NULL CHECK (amount > 0),         -- minor units
    currency        text        NOT NULL,
    reference       text        NOT NULL,                            -- the merchant's order id
    source          text        NOT NULL,                            -- card token
    status          text        NOT NULL CHECK (status IN ('captured', 'declined')),
    decline_code    text,
    idempotency_key text,                                            -- NULL: sent without one
    request_id      text        NOT NULL,                            -- req_… of the executing request
    created_at      timestamptz NOT NULL
);
CREATE INDEX captures_reference ON captures (reference, seq);
CREATE INDEX captures_idempotency_key ON captures (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- One row per idempotency key (global to the provider: there is one
-- merchant account). A request claims its key by inserting the row
-- in_progress with a lock token; it completes it, in the transaction that
-- writes the capture, only while it still holds that token. A key whose
-- holder died is taken over after PROVIDER_KEY_LOCK_TIMEOUT; a key older
-- than PROVIDER_KEY_TTL is gone (swept, or treated as absent when read).
CREATE TABLE idempotency_keys (
    key             text        PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint     bytea       NOT NULL,          -- sha256 of method, path and canonical body
    state           text        NOT NULL CHECK (state IN ('in_progress', 'done')),
    lock_token      text,                          -- the holder while in_progress
    locked_at       timestamptz,
    request_id      text        NOT NULL,          -- the request that executed (or executes)
    response_status int,                           -- the stored response, once done
    response_body   bytea,
    capture_id      text,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    CHECK ((state = 'done') = (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CHECK ((state = 'in_progress') = (lock_token IS NOT NULL))
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
