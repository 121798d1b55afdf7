-- What a check's Repair did about a finding (repair, in a sentence, and
-- when), or why its last attempt failed (repair_error: asked again next
-- round). repair_tried_at is when it was last asked: the findings not
-- repaired yet are asked in turn, the longest unasked first, so those a
-- repair can do nothing about never crowd out the rest. A finding that
-- resolves and opens again is repaired again.
ALTER TABLE audit_findings
    ADD COLUMN repair          text,
    ADD COLUMN repaired_at     timestamptz,
    ADD COLUMN repair_error    text,
    ADD COLUMN repair_tried_at timestamptz;
