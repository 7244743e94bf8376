-- Completes running jobs whose completed rows are kept: each row found at p_tids (forge.jobs_live's
-- row versions; created by one of p_creators when that is not NULL: see forge.jobs_step) that is
-- still running on p_node moves to forge.jobs_done in one statement, as state 'completed' with
-- finished_at now. Returns the rows moved; its caller counts the end of those with children
-- (has_children) in their children (forge.jobs_parent_finished), in the same transaction. The
-- one place that copies a job's columns: a column added to forge.jobs is added here too
-- (tests/it/history.rs checks that a move keeps them all).
--
-- A move, not an update that PostgreSQL would move to the other partition: a transaction that
-- waits for such a row (an operator's cancel, a rescue) would then fail ("tuple to be updated was
-- already moved to another partition"), where after a delete it finds the row gone and reads
-- the job again.
DROP FUNCTION IF EXISTS forge.jobs_move_done(tid[], xid[], text);
CREATE OR REPLACE FUNCTION forge.jobs_move_done(p_tids tid[], p_creators xid[], p_node text)
RETURNS TABLE (id bigint, run_at timestamptz, queue text, role text, has_children boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH d AS (
        -- (The guard in a CASE, which the planner never matches to jobs_running: see
        -- forge.jobs_step's header.)
        DELETE FROM forge.jobs_live j
         WHERE j.ctid = ANY (p_tids) AND (p_creators IS NULL OR j.xmin = ANY (p_creators))
           AND CASE WHEN j.state = 'running' AND j.node_id = p_node THEN true END
        RETURNING j.*
    ), i AS (
        INSERT INTO forge.jobs_done
        SELECT d.id, d.namespace, d.queue, d.kind, d.args, 'completed', d.priority, d.run_at,
               d.attempt, d.max_attempts, d.timeout_ms, d.role, d.epoch, d.unique_key, d.node_id,
               d.attempted_at, clock_timestamp(), d.errors, d.cancel_requested, d.created_at,
               d.tenure, d.started_at, d.unstarted_rescues, d.limited, d.output, d.parents,
               d.parents_left, d.on_parent_failure, d.has_children, d.kind_limited, 'completed'
          FROM d
        RETURNING jobs_done.id, jobs_done.run_at, jobs_done.queue, jobs_done.role,
                  jobs_done.has_children
    )
    SELECT i.id, i.run_at, i.queue, i.role, i.has_children FROM i;
END;
$$;
