-- Makes jobs available again now (dead, cancelled, completed, waiting for a retry or
-- scheduled), with room for one more attempt; running jobs are left alone. Returns the ids.
-- Completed jobs move back from forge.jobs_done (forge.jobs_move_live), the others are updated
-- in forge.jobs_live.
CREATE OR REPLACE FUNCTION forge.jobs_retry_now(p_namespace text, p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids  bigint[];
    v_wake text[];
BEGIN
    WITH u AS (
        UPDATE forge.jobs_live j
           SET state = 'available', run_at = clock_timestamp(), finished_at = NULL,
               cancel_requested = false, max_attempts = greatest(j.max_attempts, j.attempt + 1)
         WHERE j.namespace = p_namespace AND j.id = ANY (p_ids)
           AND j.state IN ('dead', 'cancelled', 'retryable', 'scheduled')
        RETURNING j.id, j.queue, j.role
    ), m AS (
        SELECT m.id, m.queue, m.role FROM forge.jobs_move_live(p_namespace, p_ids) m
    ), a AS (
        SELECT u.id, u.queue, u.role FROM u UNION ALL SELECT m.id, m.queue, m.role FROM m
    )
    SELECT array_agg(a.id),
           array_agg(DISTINCT CASE WHEN a.role IS NULL THEN a.queue ELSE '@' || a.role END)
      INTO v_ids, v_wake FROM a;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    RETURN QUERY SELECT unnest(coalesce(v_ids, '{}'));
END;
$$;
