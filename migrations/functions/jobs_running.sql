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
DROP FUNCTION IF EXISTS forge.jobs_running(text, text, boolean);
-- p_maybe_lost: only the jobs that may be lost (forge.jobs_maintain's rescue), those listed by
-- a role's lanes ('@' || role: the leadership may have ended) and by the lanes of nodes that
-- are not live members (down, stopped, or gone), and the busy ones. A live node's queue lanes
-- are left out: none of their jobs is lost, and reading them (a primary-key probe per job) made
-- each rescue pass cost in proportion to the cluster's running jobs (finding a dead node's 1,000
-- beside 5,000 running on a live node: 15 ms, against 3; tools/exp35/rescue.sh), where it now
-- costs in proportion to the lost ones. (A role's jobs
-- are listed by its lane: FORGE's role workers claim with no queue.)
CREATE OR REPLACE FUNCTION forge.jobs_running(p_namespace text, p_node text,
                                              p_maybe_lost boolean DEFAULT false)
RETURNS SETOF forge.jobs
LANGUAGE sql STABLE
AS $$
    -- (forge.jobs, not forge.jobs_live, whose row type a database migrated before 0015 lacks
    -- when its function files are applied; 'running' chooses the partition.)
    -- (The ids as one array, `= ANY`: one index scan of sorted keys, where `IN (subquery)`
    -- hashed them first and probed the primary key once per id - 1.9 ms against 1.2 for
    -- 1,000 listed jobs, psql's \timing. Duplicates among the lists are harmless: the
    -- scan reads each key once.)
    SELECT j.*
      FROM forge.jobs j
     WHERE j.id = ANY (ARRAY(SELECT x.id
                      FROM forge.job_lanes l, unnest(l.running) AS x(id)
                     WHERE l.namespace = p_namespace
                       AND (p_node IS NULL OR l.node_id = p_node)
                       AND (NOT p_maybe_lost OR l.lane LIKE '@%'
                            OR NOT EXISTS (SELECT 1 FROM forge.nodes n
                                            WHERE n.namespace = l.namespace
                                              AND n.node_id = l.node_id
                                              AND n.down_at IS NULL AND n.stopped_at IS NULL))
                    UNION ALL
                    SELECT b.id FROM forge.jobs_live b
                     WHERE b.namespace = p_namespace AND b.phase = 'busy'))
       AND j.namespace = p_namespace AND j.state = 'running'
       AND (p_node IS NULL OR j.node_id = p_node)
$$;
