-- Completed jobs leave the table that claims and rescues work in (issue 35).
--
-- forge.jobs becomes a table partitioned by state, with two partitions:
--   forge.jobs_live  every job that is not completed (pending, available, scheduled, running,
--                    retryable, dead, cancelled): the former table, with all its indexes;
--   forge.jobs_done  completed jobs kept for [jobs] completed_retention: append-only, with one
--                    index, a btree on id (look-ups, and pruning: see forge.jobs_prune).
-- A completion that keeps the job moves its row (one statement: a delete in jobs_live, an insert
-- in jobs_done) instead of writing a new version of it in jobs_live. That new version was never
-- HOT: it left the running-by-node index and entered the finished-by-age one (jobs_finished),
-- each an index entry per job, plus the primary key's. The move writes a delete mark and an
-- appended row with its id entry.
--
-- Readers and writers keep naming forge.jobs: PostgreSQL routes an insert to its partition and
-- moves a row whose update changes its partition (an operator's retry of a completed job moves
-- it back). Statements that write by ctid, or that read only unfinished jobs on the hot path,
-- name forge.jobs_live.
ALTER TABLE forge.jobs RENAME TO jobs_live;

CREATE TABLE forge.jobs (LIKE forge.jobs_live INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY LIST (state);
ALTER SEQUENCE forge.jobs_id_seq OWNED BY forge.jobs.id;

CREATE TABLE forge.jobs_done PARTITION OF forge.jobs FOR VALUES IN ('completed');
CREATE INDEX jobs_done_id ON forge.jobs_done (id);

-- The completed jobs there are moved over, without the triggers of forge.jobs_parent_finished
-- (a completed job's children were settled when it completed), which go to the partitioned
-- table (they apply to both partitions).
DROP TRIGGER IF EXISTS jobs_parent_ended ON forge.jobs_live;
DROP TRIGGER IF EXISTS jobs_linked_deleted ON forge.jobs_live;
INSERT INTO forge.jobs_done SELECT * FROM forge.jobs_live WHERE state = 'completed';
DELETE FROM forge.jobs_live WHERE state = 'completed';
ALTER TABLE forge.jobs ATTACH PARTITION forge.jobs_live
    FOR VALUES IN ('pending', 'available', 'scheduled', 'running', 'retryable', 'dead',
                   'cancelled');
-- jobs_finished (jobs_live's) now holds dead and cancelled jobs only. The partitions' bounds
-- admit only the known states (a row of another state has no partition: "no partition of
-- relation jobs found for row"), so the state's CHECK constraint, which every claim and every
-- completion evaluated, goes.
ALTER TABLE forge.jobs DROP CONSTRAINT jobs_state_check;
-- The other CHECK constraints hold for jobs_live only: a row enters jobs_done only from
-- jobs_live (a move copies it whole), so checking it again there, at every kept completion,
-- would check nothing new.
ALTER TABLE forge.jobs DROP CONSTRAINT jobs_max_attempts_check;
ALTER TABLE forge.jobs DROP CONSTRAINT jobs_timeout_ms_check;
ALTER TABLE forge.jobs DROP CONSTRAINT jobs_parents_left_check;
ALTER TABLE forge.jobs DROP CONSTRAINT jobs_on_parent_failure_check;
ALTER TABLE forge.jobs_live
    ADD CONSTRAINT jobs_max_attempts_check CHECK (max_attempts > 0),
    ADD CONSTRAINT jobs_timeout_ms_check CHECK (timeout_ms > 0),
    ADD CONSTRAINT jobs_parents_left_check CHECK (parents_left >= 0),
    ADD CONSTRAINT jobs_on_parent_failure_check CHECK (on_parent_failure IN ('cancel', 'run'));

COMMENT ON TABLE forge.jobs IS
    'FORGE''s durable jobs. state: pending (waiting for its parents) -> available, scheduled, running, retryable -> completed, dead (the dead-letter state), cancelled. Partitioned: forge.jobs_live holds every job not completed, forge.jobs_done the completed ones kept.';
COMMENT ON TABLE forge.jobs_live IS
    'FORGE''s jobs that are not completed (a partition of forge.jobs).';
COMMENT ON TABLE forge.jobs_done IS
    'FORGE''s completed jobs, kept for [jobs] completed_retention (a partition of forge.jobs; append-only, pruned by finished_at).';

DO $do$
BEGIN
    IF to_regprocedure('forge.jobs_parent_finished()') IS NOT NULL THEN
        CREATE TRIGGER jobs_parent_ended
            AFTER UPDATE OF state ON forge.jobs
            FOR EACH ROW
            WHEN (NEW.has_children AND NEW.state IN ('completed', 'dead', 'cancelled'))
            EXECUTE FUNCTION forge.jobs_parent_finished();
        CREATE TRIGGER jobs_linked_deleted
            AFTER DELETE ON forge.jobs
            FOR EACH ROW
            WHEN (OLD.has_children OR OLD.parents IS NOT NULL)
            EXECUTE FUNCTION forge.jobs_parent_finished();
    END IF;
END
$do$;
