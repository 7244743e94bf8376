-- Promotes due scheduled jobs and retries to available (at most p_limit), notifies their
-- queues, and returns how many were promoted, the server's clock, and how long until the next
-- one is due (NULL: none).
CREATE OR REPLACE FUNCTION forge.jobs_promote(p_namespace text, p_limit integer)
RETURNS TABLE (promoted bigint, server_now timestamptz, next_due_in_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
    v_wake  text[];
    v_next  timestamptz;
BEGIN
    WITH p AS (
        UPDATE forge.jobs_live j SET state = 'available', phase = 'ready'
         WHERE j.id IN (SELECT d.id FROM forge.jobs_live d
                         WHERE d.namespace = p_namespace AND d.phase IN ('scheduled', 'retryable')
                           AND d.run_at <= clock_timestamp()
                         ORDER BY d.run_at
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING j.queue, j.role
    )
    SELECT count(*),
           array_agg(DISTINCT CASE WHEN p.role IS NULL THEN p.queue ELSE '@' || p.role END)
      INTO v_count, v_wake
      FROM p;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    IF v_count >= p_limit THEN
        v_next := clock_timestamp();
    ELSE
        SELECT min(d.run_at) INTO v_next FROM forge.jobs_live d
         WHERE d.namespace = p_namespace AND d.phase IN ('scheduled', 'retryable');
    END IF;
    RETURN QUERY SELECT v_count, clock_timestamp(),
                        extract(epoch FROM v_next - clock_timestamp())::double precision * 1000;
END;
$$;
