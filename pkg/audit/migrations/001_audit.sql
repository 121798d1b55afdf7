-- The auditor's state: how far each check has read (its watermark), and what
-- it found. A check reads only what lies past its watermark, so a round costs
-- what arrived since the last one, whatever the size of the tables it audits.
CREATE TABLE audit_watermarks (
    check_name text        PRIMARY KEY,
    -- The last entity examined: its time and key, in the check's order
    -- (no time: nothing examined yet).
    mark_time  timestamptz,
    mark_key   text        NOT NULL DEFAULT '',
    examined   bigint      NOT NULL DEFAULT 0,
    -- batch_at: when the last batch committed; caught_up_at: when a batch
    -- last found fewer entities than its limit, the check up to its grace
    -- period (a check that never catches up falls behind: its age grows).
    batch_at     timestamptz,
    caught_up_at timestamptz
);

-- One row per (check, entity, kind): a breach found again is the same
-- finding (last_seen moves), one that no longer holds is resolved, and one
-- that comes back is opened again (raised counts the openings).
CREATE TABLE audit_findings (
    check_name  text        NOT NULL,
    entity      text        NOT NULL,
    kind        text        NOT NULL,
    detail      text        NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    resolved_at timestamptz,
    raised      int         NOT NULL DEFAULT 1,
    PRIMARY KEY (check_name, entity, kind)
);

-- Each round re-examines a check's open findings, the longest unseen first.
CREATE INDEX audit_findings_open ON audit_findings (check_name, last_seen) WHERE resolved_at IS NULL;
