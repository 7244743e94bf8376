-- Deletes at most p_limit jobs in one of p_states that finished longer than the retention ago,
-- and returns how many: the body of the compactor's prune_finished_jobs and prune_dead_jobs
-- (which fence first). Rows another transaction holds (an operator's action, a frozen
-- session) are skipped and deleted at a later pass.
--
-- Completed jobs (forge.jobs_done) have no index by age, so that a completion writes none. They
-- are found by id instead, below the first one created after the cutoff: ids follow creation
-- (the sequence and created_at are taken in the same insert), and a job created after the
-- cutoff finished after it. So a pass reads the completed jobs created before the cutoff: the
-- ones it deletes, and the few kept longer (created before the cutoff, completed after it: a
-- job scheduled far ahead, retried, or another namespace's with a longer retention). Dead and
-- cancelled jobs (forge.jobs_live) are found by jobs_finished.
CREATE OR REPLACE FUNCTION forge.jobs_prune(
    p_namespace text, p_states text[], p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE sql
AS $$
    WITH old AS (
        SELECT f.id FROM forge.jobs_done f
         WHERE 'completed' = ANY (p_states)
           AND f.id < coalesce((SELECT n.id FROM forge.jobs_done n
                                 WHERE n.created_at >= clock_timestamp()
                                                       - p_retention_ms * interval '1 millisecond'
                                 ORDER BY n.id LIMIT 1), 9223372036854775807)
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
                         WHERE f.namespace = p_namespace AND f.phase = ANY (p_states)
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING 1
    ) SELECT (SELECT count(*) FROM done) + (SELECT count(*) FROM live);
$$;
