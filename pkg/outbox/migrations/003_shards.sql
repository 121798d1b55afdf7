-- Sharded relays (RelayConfig.Shards > 1). The outbox is divided into shards
-- by a hash of the partition key (rows without a key, by id); each shard is
-- published by one relay at a time, its owner, through a lease: a row here
-- with the owner's id, a fencing token that grows at every change of owner
-- (and stays above every earlier token when the table is rebuilt),
-- and an expiry the owner renews. A relay's batch locks the leases it relies
-- on FOR SHARE and claims only rows of shards whose token is still its own,
-- so a shard cannot change owner while a batch of it is open, and a relay
-- that lost a shard claims and marks nothing of it again.
CREATE TABLE outbox_shards (
    shard      int         PRIMARY KEY CHECK (shard >= 0),
    -- the count the table was built for: a relay configured with another
    -- count renews, takes and claims nothing of it
    shards     int         NOT NULL CHECK (shard < shards),
    owner      text,
    token      bigint      NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity'
);

-- The relays that share the shards, by their heartbeats: each takes its
-- fair share of the shards, ceil(shards / live relays).
CREATE TABLE outbox_relays (
    relay_id text        PRIMARY KEY,
    seen_at  timestamptz NOT NULL DEFAULT now()
);
