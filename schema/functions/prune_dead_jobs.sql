-- Prunes dead-lettered jobs older than the retention.
--
-- Rows another transaction holds (an operator's action, a frozen session) are skipped and
-- deleted at a later pass.
CREATE OR REPLACE FUNCTION forge.prune_dead_jobs(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state = 'dead'
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;
