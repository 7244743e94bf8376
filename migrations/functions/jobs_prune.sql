-- Deletes at most p_limit jobs in one of p_states that finished longer than the retention ago,
-- and returns how many: the body of the compactor's prune_finished_jobs and prune_dead_jobs
-- (which fence first). Rows another transaction holds (an operator's action, a frozen
-- session) are skipped and deleted at a later pass.
CREATE OR REPLACE FUNCTION forge.jobs_prune(
    p_namespace text, p_states text[], p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE sql
AS $$
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state = ANY (p_states)
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING 1
    ) SELECT count(*) FROM d;
$$;
