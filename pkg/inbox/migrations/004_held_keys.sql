-- The key-scoped poison hold (Config.OnDeadLetter = HoldKey, see hold.go).
--
-- A parked message is finished with for deduplication (its inbox row, with
-- the new status 'parked', suppresses a redelivery and keeps the payload
-- hash for the conflict check) but not applied: its payload and metadata
-- wait in inbox_parked until its key is released.
ALTER TABLE inbox_messages
    DROP CONSTRAINT inbox_messages_status_check,
    ADD CONSTRAINT inbox_messages_status_check
        CHECK (status IN ('processed', 'dead_lettered', 'quarantined', 'parked'));

-- One row per held key of a consumer's topic: the message that holds it (a
-- dead letter, or the parked message a Discard wrote back in its place) and
-- where the release stands:
--   held:     the holder is dead-lettered; later messages of the key park;
--   redriven: the holder was written back through the outbox; it alone is
--             applied when it comes back, the others still park;
--   released: the holder was applied; the parked messages are applied in
--             arrival order, then the row is deleted.
-- Every transaction that reads or changes a hold takes its row FOR UPDATE.
CREATE TABLE inbox_held_keys (
    consumer      text        NOT NULL,
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    holder        text        NOT NULL,
    state         text        NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'redriven', 'released')),
    held_at       timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, partition_key)
);

-- Redrive and Discard find the hold of the dead letter they resolve.
CREATE INDEX inbox_held_keys_holder ON inbox_held_keys (consumer, holder);

-- Parked messages, in arrival order (seq), with what it takes to apply them
-- later without Kafka.
CREATE TABLE inbox_parked (
    consumer      text        NOT NULL,
    message_id    text        NOT NULL,
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    payload       bytea       NOT NULL,
    metadata      jsonb       NOT NULL DEFAULT '{}',
    parked_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_parked_key ON inbox_parked (consumer, topic, partition_key, seq);
