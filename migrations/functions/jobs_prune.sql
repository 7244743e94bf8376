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
-- cancelled jobs (forge.jobs_live) are found by jobs_finished. A pruned row's dependency edges go
-- with it (forge.jobs_parent_finished, which first counts an end an operator's SQL wrote and the
-- scheduler's pass has not counted yet). Each partition is deleted from by itself: through
-- forge.jobs_delete, a delete of forge.jobs by id, each id would probe both partitions' keys.
CREATE OR REPLACE FUNCTION forge.jobs_prune(
    p_namespace text, p_states text[], p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_n    bigint;
    v_gone bigint[];
    v_ends text[];
BEGIN
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
        RETURNING j.id, j.state, j.has_children OR j.parents IS NOT NULL AS linked
    ), live AS (
        DELETE FROM forge.jobs_live j
         WHERE j.id IN (SELECT f.id FROM forge.jobs_live f
                         WHERE f.namespace = p_namespace AND f.phase = ANY (p_states)
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING j.id, j.state, j.has_children OR j.parents IS NOT NULL AS linked
    ), gone AS (
        SELECT * FROM done UNION ALL SELECT * FROM live
    )
    SELECT count(*), array_agg(gone.id) FILTER (WHERE gone.linked),
           array_agg(gone.state) FILTER (WHERE gone.linked)
      INTO v_n, v_gone, v_ends
      FROM gone;
    IF v_gone IS NOT NULL THEN
        PERFORM forge.jobs_parent_finished(v_gone, v_ends, true);
    END IF;
    RETURN v_n;
END;
$$;
