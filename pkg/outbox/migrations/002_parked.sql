-- A row the broker can never accept (too large for it, an invalid record) is
-- parked: it stays unpublished, with the reason, out of the relay's way,
-- until an operator retries it (after raising the broker's limit, say) or
-- drops it (outbox.Retry, outbox.Drop; cmd/outboxctl). Later rows with the
-- same topic and partition key wait behind it, so that key's order holds.
ALTER TABLE outbox_messages
    ADD COLUMN parked_at   timestamptz,
    ADD COLUMN park_reason text;

-- The relay asks, for every row it claims, whether an earlier row of the
-- same key is parked: an index probe into an index that is almost always
-- empty.
CREATE INDEX outbox_messages_parked ON outbox_messages (topic, partition_key, id) WHERE parked_at IS NOT NULL;

-- Dropped rows are kept, with who dropped them and why, not deleted.
CREATE TABLE outbox_dropped (
    id            bigint      PRIMARY KEY,
    message_id    uuid        NOT NULL,
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    payload       bytea       NOT NULL,
    metadata      jsonb       NOT NULL,
    created_at    timestamptz NOT NULL,
    parked_at     timestamptz,
    park_reason   text,
    dropped_at    timestamptz NOT NULL DEFAULT now(),
    dropped_by    text        NOT NULL,
    drop_reason   text        NOT NULL
);
