-- Where each message was read (the highest offset of its copies this
-- consumer saw), so the sweep can keep a row while Kafka still holds a copy
-- it could hand out again (Config.LogStart). NULL: not read from Kafka, or
-- a row older than this migration; kafka_partition -1: copies on several
-- partitions, swept by age alone.
ALTER TABLE inbox_messages ADD COLUMN kafka_partition int, ADD COLUMN kafka_offset bigint;
