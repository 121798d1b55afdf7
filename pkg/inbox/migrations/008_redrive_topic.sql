-- Where each consumer takes its redrives from (Config.RedriveTopic).
--
-- A redrive (RetryQuarantined, a bulk retry) writes a dead letter back
-- through the consumer's own outbox. To the topic it came from, the
-- consumer's Kafka principal would need to write its producer's topic,
-- which it should not be allowed to; to a redrive topic of its own, it
-- needs only its own. Inbox.Run records the consumer's choice here, and the
-- redrive reads it: a consumer with no row, or an empty redrive_topic, gets
-- its redrives on the topic they came from. A role the inbox logs in as
-- needs SELECT, INSERT and UPDATE on inbox_consumers; one that only
-- redrives (an operator's), SELECT.
CREATE TABLE inbox_consumers (
    consumer      text        PRIMARY KEY,
    redrive_topic text        NOT NULL DEFAULT '',
    updated_at    timestamptz NOT NULL DEFAULT now()
);
