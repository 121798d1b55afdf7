-- The records of a topic a consumer never read because the broker no
-- longer held them (Inbox.RecordSkipped, docs/broker-loss.md): a range of
-- offsets [from_offset, to_offset) of one partition, found when the
-- partition's log start passed the consumer group's committed offset
-- (retention, kafka-delete-records: cause 'deleted'), or its log end fell
-- below it (the topic deleted and created again, an unclean leader
-- election: 'truncated'). One row per range's start: a log start that moves
-- on while the offset stays extends the row. repaired_at is set once the
-- producer has sent the range's messages again. A role the consumer logs
-- in as needs SELECT, INSERT and UPDATE on it; an operator's, SELECT.
CREATE TABLE inbox_skipped_ranges (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition int         NOT NULL,
    from_offset     bigint      NOT NULL,
    to_offset       bigint      NOT NULL CHECK (to_offset > from_offset),
    cause           text        NOT NULL CHECK (cause IN ('deleted', 'truncated')),
    detected_at     timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    repaired_at     timestamptz,
    PRIMARY KEY (consumer, topic, kafka_partition, from_offset)
);
