-- The attempts claimed under a queue's global concurrency limit, one row each, counted by the
-- queue's next claims (forge.jobs_step) in place of the partial index jobs_limited.
--
-- Why: every UPDATE of a job compares, old row with new, each column that an index of
-- forge.jobs names (PostgreSQL decides so whether the update may be HOT), and a column near the
-- end of a wide row with nullable columns before it is found by walking the row from its start.
-- jobs_limited named `limited`, the 24th column, for every update of every job, limited or not:
-- about 2 % more instructions per job in forge.jobs_step's drain of a queue without limits
-- (tools/cost33). This table costs such a queue nothing: only claims under a global limit write
-- it.
--
-- A row is a slot held while its job runs that attempt: once the job's row is no longer running
-- with that attempt (completed, failed, rescued, retried, deleted), the slot is free, and the
-- next claim of the queue deletes it under the queue's limit lock before it counts. So the
-- jobs' ends, on whatever path, write nothing here. forge.jobs.limited is no longer written or
-- read (kept: dropping it would break a node of the previous release still running during an
-- upgrade).
CREATE TABLE forge.queue_slots (
    namespace text    NOT NULL,
    queue     text    NOT NULL,
    job_id    bigint  NOT NULL,
    attempt   integer NOT NULL,
    PRIMARY KEY (namespace, queue, job_id)
);

COMMENT ON TABLE forge.queue_slots IS
    'Attempts claimed under a queue''s global concurrency limit; a row whose job no longer runs that attempt is free, deleted by the queue''s next claim.';
COMMENT ON COLUMN forge.jobs.limited IS
    'Unused since migration 0013 (forge.queue_slots holds the attempts claimed under a queue''s global limit).';

-- The attempts running under a limit now.
INSERT INTO forge.queue_slots (namespace, queue, job_id, attempt)
SELECT namespace, queue, id, attempt FROM forge.jobs WHERE state = 'running' AND limited;

DROP INDEX forge.jobs_limited;
