-- The dry run each bulk action was started from (Plan.ID).
--
-- A confirmation sent twice (a double click, a retried request) starts the
-- same plan twice: StartBulk returns the action the first started, whether
-- it still runs or has finished, instead of a second one. Actions recorded
-- before this migration, and plans built without a dry run, have none.
ALTER TABLE inbox_actions ADD COLUMN plan text;
CREATE UNIQUE INDEX inbox_actions_plan ON inbox_actions (plan) WHERE plan IS NOT NULL;
