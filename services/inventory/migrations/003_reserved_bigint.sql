-- A SKU's reserved units only grow: each reservation adds its quantity, and
-- restocking (PUT /stock) refills available, not reserved. Over a long life
-- that sum passes 2^31 - 1, and in an int column every later order of the
-- SKU would then fail its transaction ("integer out of range") and be
-- dead-lettered, paid and never reserved. bigint holds 4 billion times
-- more: at 10,000 units a second, 29 million years.
ALTER TABLE stock ALTER COLUMN reserved TYPE bigint;
