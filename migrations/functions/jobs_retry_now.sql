-- Makes jobs available again now (dead, cancelled, completed, waiting for a retry or
-- scheduled), with room for one more attempt; running jobs are left alone. Returns the ids.
CREATE OR REPLACE FUNCTION forge.jobs_retry_now(p_namespace text, p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids  bigint[];
    v_wake text[];
BEGIN
    WITH u AS (
        UPDATE forge.jobs j
           SET state = 'available', run_at = clock_timestamp(), finished_at = NULL,
               cancel_requested = false, max_attempts = greatest(j.max_attempts, j.attempt + 1)
         WHERE j.namespace = p_namespace AND j.id = ANY (p_ids)
           AND j.state IN ('dead', 'cancelled', 'completed', 'retryable', 'scheduled')
        RETURNING j.id, j.queue, j.role
    )
    SELECT array_agg(u.id),
           array_agg(DISTINCT CASE WHEN u.role IS NULL THEN u.queue ELSE '@' || u.role END)
      INTO v_ids, v_wake FROM u;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    RETURN QUERY SELECT unnest(coalesce(v_ids, '{}'));
END;
$$;
