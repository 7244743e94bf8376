-- PC: P (s2_claim.sql and p_claim.sql, applied first) with a phase that the writers set (here, in this drain,
-- its default: every job enqueued is available), under a CHECK constraint, instead of a
-- generated column.
ALTER TABLE forge.jobs ALTER COLUMN phase DROP EXPRESSION;
ALTER TABLE forge.jobs ALTER COLUMN phase SET DEFAULT 'ready';
ALTER TABLE forge.jobs ALTER COLUMN phase SET NOT NULL;
ALTER TABLE forge.jobs_live ADD CONSTRAINT jobs_phase_check
    CHECK (phase = CASE WHEN state IN ('available', 'running') THEN 'ready' ELSE state END);
