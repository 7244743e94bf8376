-- The attempts claimed under a job kind's global concurrency limit, one row each, counted by the
-- kind's next claims (forge.jobs_step, forge.kind_limits_now) in place of the partial index
-- jobs_kind_limited, for the reason migration 0013 gives for a queue's: that index named the
-- row's last column, kind_limited, which every update of every job then compared, old row with
-- new (PostgreSQL's HOT check), walking the row from its start to find it: about 2.8 % of
-- forge.jobs_step's instructions per job on a queue whose kinds have no limits
-- (tools/cost33/callgrind.sh). This table costs such a queue nothing: only claims of a kind
-- under a global limit write it.
--
-- A row is a slot held while its job runs that attempt: once the job's row is no longer running
-- with that attempt (completed, failed, rescued, retried, snoozed, deleted), the slot is free,
-- and the kind's next claim deletes it under the kind's limit lock before it counts.
-- forge.jobs.kind_limited is no longer written or read (kept: dropping it would break a node of
-- the previous release still running during an upgrade).
CREATE TABLE forge.kind_slots (
    namespace text    NOT NULL,
    kind      text    NOT NULL,
    job_id    bigint  NOT NULL,
    attempt   integer NOT NULL,
    PRIMARY KEY (namespace, kind, job_id)
);

COMMENT ON TABLE forge.kind_slots IS
    'Attempts claimed under a job kind''s global concurrency limit; a row whose job no longer runs that attempt is free, deleted by the kind''s next claim.';
COMMENT ON COLUMN forge.jobs.kind_limited IS
    'Unused since migration 0014 (forge.kind_slots holds the attempts claimed under a kind''s global limit).';

-- The attempts running under a kind's limit now.
INSERT INTO forge.kind_slots (namespace, kind, job_id, attempt)
SELECT namespace, kind, id, attempt FROM forge.jobs WHERE state = 'running' AND kind_limited;

DROP INDEX forge.jobs_kind_limited;
