-- What arrived, as it arrived, whatever it was.
--
-- A Kafka record may have no value at all (a tombstone). Its quarantine row
-- and its parked row keep that as a NULL payload, apart from an empty one;
-- a NOT NULL payload failed the insert on every redelivery, and the record
-- blocked its partition for good. payload_sha256 of such a record is the
-- hash of no bytes, as of an empty one: the two differ only in payload.
ALTER TABLE inbox_quarantine ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE inbox_parked ALTER COLUMN payload DROP NOT NULL;

-- Header names and values are bytes. metadata keeps them as text (jsonb),
-- where a NUL byte or invalid UTF-8 becomes U+FFFD; when that changed any of
-- them, raw_metadata keeps every entry as it arrived, name and value each in
-- standard base64. NULL: metadata is exact.
ALTER TABLE inbox_quarantine ADD COLUMN raw_metadata jsonb;
