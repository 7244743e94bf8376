-- Sets a queue's limits (forge.queue_limits). p_by NULL: forge.toml's values, written by a
-- node at start; they replace forge.toml's earlier values but never an operator's (the
-- operator's win until forge.queue_limit_reset), and no limits at all remove forge.toml's row.
-- p_by set: an operator's values (no limits at all included), recorded in the audit trail.
-- Returns whether the values were written.
--
-- Under the queue's limit lock (forge.jobs_step), so no claim of the queue is under way: the
-- queue's running attempts are given slots (forge.queue_slots) as if claimed under the limit,
-- to be counted by the next claims (an attempt claimed before the queue had a global limit counts from now on). The
-- queue's workers are woken: a raised or removed limit lets them claim more.
CREATE OR REPLACE FUNCTION forge.queue_limit_set(
    p_namespace text, p_queue text, p_global integer, p_rate_count integer,
    p_rate_window_ms bigint, p_rate_key text, p_by text
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('forge.queue_limit'),
                                  hashtext(p_namespace || ' ' || p_queue));
    IF p_by IS NULL AND EXISTS (SELECT 1 FROM forge.queue_limits l
                                 WHERE l.namespace = p_namespace AND l.queue = p_queue
                                   AND l.set_by IS NOT NULL) THEN
        RETURN false;
    END IF;
    IF p_by IS NULL AND p_global IS NULL AND p_rate_count IS NULL THEN
        DELETE FROM forge.queue_limits l WHERE l.namespace = p_namespace AND l.queue = p_queue;
    ELSE
        INSERT INTO forge.queue_limits AS l (namespace, queue, global_concurrency, rate_count,
                                             rate_window_ms, rate_key, set_at, set_by)
        VALUES (p_namespace, p_queue, p_global, p_rate_count, p_rate_window_ms, p_rate_key,
                clock_timestamp(), p_by)
        ON CONFLICT (namespace, queue) DO UPDATE
           SET global_concurrency = EXCLUDED.global_concurrency,
               rate_count = EXCLUDED.rate_count, rate_window_ms = EXCLUDED.rate_window_ms,
               rate_key = EXCLUDED.rate_key, set_at = EXCLUDED.set_at, set_by = EXCLUDED.set_by
         WHERE (l.global_concurrency, l.rate_count, l.rate_window_ms, l.rate_key, l.set_by)
               IS DISTINCT FROM (EXCLUDED.global_concurrency, EXCLUDED.rate_count,
                                 EXCLUDED.rate_window_ms, EXCLUDED.rate_key, EXCLUDED.set_by);
    END IF;
    IF p_rate_count IS NULL THEN
        DELETE FROM forge.queue_claims c WHERE c.namespace = p_namespace AND c.queue = p_queue;
    END IF;
    IF p_global IS NOT NULL THEN
        INSERT INTO forge.queue_slots (namespace, queue, job_id, attempt)
        SELECT j.namespace, j.queue, j.id, j.attempt FROM forge.jobs_running(p_namespace, NULL) j
         WHERE j.queue = p_queue
           AND j.role IS NULL
        ON CONFLICT (namespace, queue, job_id) DO UPDATE SET attempt = EXCLUDED.attempt;
    ELSE
        DELETE FROM forge.queue_slots s WHERE s.namespace = p_namespace AND s.queue = p_queue;
    END IF;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || p_queue);
    IF p_by IS NOT NULL THEN
        PERFORM forge.audit(p_namespace, 'limit_queue', p_queue, p_by,
                            jsonb_build_object('global_concurrency', p_global,
                                               'rate_count', p_rate_count,
                                               'rate_window_ms', p_rate_window_ms,
                                               'rate_key', p_rate_key));
    END IF;
    RETURN true;
END;
$$;
