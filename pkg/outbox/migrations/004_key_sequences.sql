-- A sequence per partition key, so that a consumer can see a gap (an event
-- of the key that never reached it) or a rewind (the producer numbered an
-- event again: its database went back in time, as after a lossy failover).
--
-- PublishTx assigns the numbers in the producer's transaction, one row per
-- (topic, key) here, upserted under the key's lock: the n-th event written
-- for a key carries n, whichever relay publishes it and however often. The
-- numbers are those of this outbox's stream, drawn once here: a replica or
-- a restore of the database keeps it (so a consumer sees their rewinds),
-- another outbox has its own (a consumer's redrive through its own outbox
-- is not numbered among the producer's events).
--
-- A role producers log in as needs SELECT, INSERT and UPDATE on
-- outbox_key_sequences and SELECT on outbox_stream beside INSERT on
-- outbox_messages (and so does a consumer's, which writes its dead letters
-- through the outbox); the relay's, DELETE on outbox_key_sequences too
-- (retention).
CREATE TABLE outbox_stream (
    id         uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    one        boolean     NOT NULL DEFAULT true UNIQUE CHECK (one),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_stream DEFAULT VALUES;

CREATE TABLE outbox_key_sequences (
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    seq           bigint      NOT NULL CHECK (seq > 0),
    touched_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition_key)
);

-- Retention deletes the counters of keys no event was written for lately
-- (RelayConfig.KeySequenceRetention): keep them longer than any consumer
-- keeps its state of a key (inbox.Config.Retention), or a key written again
-- after its counter went starts at 1 where a consumer remembers more: a
-- rewind, falsely.
CREATE INDEX outbox_key_sequences_touched ON outbox_key_sequences (touched_at);
