-- A sequence per partition key, so that a consumer can see a gap (an event
-- of the key that never reached it) or a rewind (the producer issued a
-- number again: its database went back in time, as after a lossy failover).
--
-- PublishTx assigns the numbers in the producer's transaction, one row per
-- (topic, key) here, upserted under the key's lock: the n-th event written
-- for a key carries n, whichever relay publishes it and however often.
-- stream is drawn when the row is made: a key whose row was swept (or never
-- replicated) starts a new stream at 1, which a consumer takes as a new
-- history, not as a rewind of the old one.
--
-- A role producers log in as needs SELECT, INSERT and UPDATE here beside
-- INSERT on outbox_messages.
CREATE TABLE outbox_key_sequences (
    topic         text        NOT NULL,
    partition_key text        NOT NULL,
    stream        uuid        NOT NULL DEFAULT gen_random_uuid(),
    seq           bigint      NOT NULL CHECK (seq > 0),
    touched_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition_key)
);

-- Retention deletes the counters of keys no event was written for lately.
CREATE INDEX outbox_key_sequences_touched ON outbox_key_sequences (touched_at);
