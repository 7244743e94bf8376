-- The running jobs of a namespace (p_node NULL) or of one node: every reader of "who runs what"
-- - rescue, a node's own rescue at its start, the worker's reconciliation, the queue figures,
-- a limit set while jobs run - reads them here.
--
-- No index names a running job's node or its state (a claim is a HOT update, migration 0016):
-- a running job is named by its lane's list (forge.job_lanes.running: the claims of
-- forge.jobs_step, 'ready') or by jobs_busy (phase 'busy': running by other means). The lists
-- are supersets - they may still name jobs that ended, or that another node claimed since -
-- so each named job is read here (a primary-key probe) and kept only while it reads 'running'
-- (on p_node).
-- (Dropped first: on a database whose function files were applied before migration 0015, the
-- row type it returns is the table that 0015 renamed forge.jobs_live, and a replacement may
-- not change it.)
DROP FUNCTION IF EXISTS forge.jobs_running(text, text);
CREATE OR REPLACE FUNCTION forge.jobs_running(p_namespace text, p_node text)
RETURNS SETOF forge.jobs
LANGUAGE sql STABLE
AS $$
    -- (forge.jobs, not forge.jobs_live, whose row type a database migrated before 0015 lacks
    -- when its function files are applied; 'running' chooses the partition.)
    SELECT j.*
      FROM forge.jobs j
     WHERE j.id IN (SELECT x.id
                      FROM forge.job_lanes l, unnest(l.running) AS x(id)
                     WHERE l.namespace = p_namespace
                       AND (p_node IS NULL OR l.node_id = p_node)
                    UNION
                    SELECT b.id FROM forge.jobs_live b
                     WHERE b.namespace = p_namespace AND b.phase = 'busy')
       AND j.namespace = p_namespace AND j.state = 'running'
       AND (p_node IS NULL OR j.node_id = p_node)
$$;
