-- The outbox: one row per message to publish. A row is written in the same
-- transaction as the domain change it announces, so it exists if and only if
-- that change committed.
CREATE TABLE outbox_messages (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    uuid        NOT NULL,
    topic         text        NOT NULL,
    partition_key text        NOT NULL DEFAULT '',
    payload       bytea       NOT NULL,
    metadata      jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);

-- The relay's hot query reads the oldest unpublished rows:
--   SELECT ... WHERE published_at IS NULL ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED
-- A partial index holds only the pending rows, so it stays small however many
-- published rows wait for retention (EXPLAIN: Index Scan using
-- outbox_messages_pending on outbox_messages, then LockRows).
CREATE INDEX outbox_messages_pending ON outbox_messages (id) WHERE published_at IS NULL;

-- Retention deletes published rows oldest first.
CREATE INDEX outbox_messages_published ON outbox_messages (published_at) WHERE published_at IS NOT NULL;
