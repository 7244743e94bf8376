-- Job results and job dependencies (issue 34).
--
-- output: what the handler returned or set (JSON), written in the transaction that completes
-- the job (forge.jobs_complete's caller), so a completed job and its output are one commit.
--
-- Dependencies: a job enqueued with parents (NewJob::after) waits in state 'pending', which no
-- claim reads, until every parent finished. The child row carries its parents (parents), how
-- many are still unfinished (parents_left) and what to do when one ends dead or cancelled
-- (on_parent_failure); forge.job_edges links each parent to its children, and has_children
-- marks a parent row, so that the triggers of forge.jobs_parent_finished fire for such rows
-- only: a job without children pays one WHEN test per row and nothing else.
ALTER TABLE forge.jobs
    ADD COLUMN output jsonb,
    ADD COLUMN parents bigint[],
    ADD COLUMN parents_left integer CHECK (parents_left >= 0),
    ADD COLUMN on_parent_failure text CHECK (on_parent_failure IN ('cancel', 'run')),
    ADD COLUMN has_children boolean NOT NULL DEFAULT false;

ALTER TABLE forge.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE forge.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('pending', 'available', 'scheduled', 'running', 'retryable',
                     'completed', 'dead', 'cancelled'));

COMMENT ON TABLE forge.jobs IS
    'FORGE''s durable jobs. state: pending (waiting for its parents) -> available, scheduled, running, retryable -> completed, dead (the dead-letter state), cancelled.';

-- A parent and one of its children. resolved: the parent's end was counted in the child's
-- parents_left (once: a parent retried and finished again counts nothing more). Deleted with
-- either job's row.
CREATE TABLE forge.job_edges (
    parent_id bigint  NOT NULL,
    child_id  bigint  NOT NULL,
    resolved  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX job_edges_child ON forge.job_edges (child_id);

COMMENT ON TABLE forge.job_edges IS
    'Job dependencies: each child of a parent job (NewJob::after). resolved: the parent''s end was counted in the child''s parents_left.';

-- Pending jobs for the queue figures.
CREATE INDEX jobs_pending ON forge.jobs (namespace, queue, kind) INCLUDE (run_at)
    WHERE state = 'pending';

-- The triggers of forge.jobs_parent_finished, when that function exists already (its file was
-- applied before this migration); otherwise its file creates them (see it).
DO $do$
BEGIN
    IF to_regprocedure('forge.jobs_parent_finished()') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS jobs_parent_ended ON forge.jobs;
        CREATE TRIGGER jobs_parent_ended
            AFTER UPDATE OF state ON forge.jobs
            FOR EACH ROW
            WHEN (NEW.has_children AND NEW.state IN ('completed', 'dead', 'cancelled'))
            EXECUTE FUNCTION forge.jobs_parent_finished();
        DROP TRIGGER IF EXISTS jobs_linked_deleted ON forge.jobs;
        CREATE TRIGGER jobs_linked_deleted
            AFTER DELETE ON forge.jobs
            FOR EACH ROW
            WHEN (OLD.has_children OR OLD.parents IS NOT NULL)
            EXECUTE FUNCTION forge.jobs_parent_finished();
    END IF;
END
$do$;
