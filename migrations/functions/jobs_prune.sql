-- Deletes at most p_limit jobs in one of p_states that finished longer than the retention ago,
-- and returns how many: the body of the compactor's prune_finished_jobs and prune_dead_jobs
-- (which fence first). Rows another transaction holds (an operator's action, a frozen
-- session) are skipped and deleted at a later pass.
--
-- Completed jobs (forge.jobs_done) have no index by age, so that a completion writes none:
-- they are walked in id order, which is nearly the order in which they completed, and the walk
-- passes over the few kept ones of lower id that completed later (a job scheduled far ahead, a
-- retried one; and, in a database shared by namespaces, another namespace's). Dead and
-- cancelled jobs (forge.jobs_live) are found by jobs_finished.
CREATE OR REPLACE FUNCTION forge.jobs_prune(
    p_namespace text, p_states text[], p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE sql
AS $$
    WITH old AS (
        SELECT f.id FROM forge.jobs_done f
         WHERE 'completed' = ANY (p_states)
           AND f.namespace = p_namespace
           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
         ORDER BY f.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), done AS (
        DELETE FROM forge.jobs_done j WHERE j.id IN (SELECT old.id FROM old)
        RETURNING 1
    ), live AS (
        DELETE FROM forge.jobs_live j
         WHERE j.id IN (SELECT f.id FROM forge.jobs_live f
                         WHERE f.namespace = p_namespace AND f.state = ANY (p_states)
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING 1
    ) SELECT (SELECT count(*) FROM done) + (SELECT count(*) FROM live);
$$;
