-- Failure groups and bulk actions (groups.go, bulk.go).
--
-- A failure group is the open quarantined messages of a consumer that failed
-- alike: the same kind, the same reason once its variable parts are masked,
-- the same event type and the same producer key. A bad deploy that
-- dead-letters ten thousand messages makes one group, not ten thousand rows.

-- The reason with what varies from message to message masked: quoted values
-- (Go's %q) become "…", UUIDs and ULIDs <id>, 0x… and runs of eight or more
-- hex digits with a digit and a letter (hashes) <hex>, numbers <n>. IMMUTABLE,
-- so that generated columns can use it. Word boundaries (\m, \M) follow the
-- database's LC_CTYPE for letters beyond ASCII. What it cannot tell apart it
-- merges: "status 404" and "status 503" are one pattern; look at a group's
-- messages before dropping it.
CREATE FUNCTION inbox_reason_pattern(reason text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURNS NULL ON NULL INPUT
RETURN regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(reason,
    '"([^"\\]|\\.)*"', '"…"', 'g'),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<id>', 'g'),
    '\m[0-9A-HJKMNP-TV-Z]{26}\M', '<id>', 'g'),
    '\m0x[0-9a-fA-F]+\M', '<hex>', 'g'),
    '\m(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\M', '<hex>', 'g'),
    '[0-9]+(\.[0-9]+)?', '<n>', 'g');

-- The group's id: 16 hex digits of the MD5 of what makes it, its consumer's
-- too (a name for URLs and filters, not a secret). The event type and
-- producer key are read from the headers the outbox and pkg/signature write
-- (event_type, signature_key_id).
CREATE FUNCTION inbox_failure_group(consumer text, kind text, reason text, metadata jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN left(md5(consumer || chr(31) || kind || chr(31) || coalesce(inbox_reason_pattern(reason), '') || chr(31)
    || coalesce(metadata->>'event_type', '') || chr(31) || coalesce(metadata->>'signature_key_id', '')), 16);

-- Adding a stored column rewrites the table under an exclusive lock, masking
-- every row's reason (~12 µs a row: two minutes for ten million rows of
-- quarantine history); dead-lettering waits meanwhile. docs/operate.md,
-- "Upgrading", says how to plan it.
ALTER TABLE inbox_quarantine
    ADD COLUMN failure_group text GENERATED ALWAYS AS (inbox_failure_group(consumer, kind, reason, metadata)) STORED;

-- The open rows by group, in id order: the groups (an index-only scan with
-- created_at) and a group's messages, a page at a time.
CREATE INDEX IF NOT EXISTS inbox_quarantine_groups ON inbox_quarantine (consumer, failure_group, id)
    INCLUDE (created_at) WHERE resolved_at IS NULL;

-- The history of what operators did to quarantined messages: every retry
-- and drop, one at a time or in bulk, is an action here, written in the
-- transaction that does it. A bulk action chooses its messages when it
-- starts (inbox_action_items) and does them in batches: each batch marks
-- its items done in the transaction that redrives or discards them, so an
-- action killed half-way goes on where it stopped and does each message
-- once.
-- Grant both tables (INSERT, SELECT, UPDATE) to every role that redrives or
-- discards: each retry and drop writes here.
CREATE TABLE inbox_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('retry', 'drop')),
    actor       text        NOT NULL CHECK (actor <> ''),
    why         text        NOT NULL DEFAULT '',
    selection   jsonb       NOT NULL, -- the filter that chose the messages
    selected    int         NOT NULL, -- how many it chose
    done        int         NOT NULL DEFAULT 0, -- redriven or discarded
    skipped     int         NOT NULL DEFAULT 0, -- resolved meanwhile, or applied
    refused     int         NOT NULL DEFAULT 0, -- cannot be redriven (the note says why)
    state       text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'stopped', 'finished')),
    stopped_by  text,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CHECK ((state = 'running') = (finished_at IS NULL)),
    CHECK ((state = 'stopped') = (stopped_by IS NOT NULL))
);
CREATE INDEX inbox_actions_consumer ON inbox_actions (consumer, id);
CREATE INDEX inbox_actions_running ON inbox_actions (id) WHERE state = 'running';

CREATE TABLE inbox_action_items (
    action_id     bigint NOT NULL REFERENCES inbox_actions (id),
    quarantine_id bigint NOT NULL,
    outcome       text CHECK (outcome IN ('done', 'skipped', 'refused')),
    note          text,
    done_at       timestamptz,
    PRIMARY KEY (action_id, quarantine_id)
);
CREATE INDEX inbox_action_items_todo ON inbox_action_items (action_id, quarantine_id) WHERE outcome IS NULL;
