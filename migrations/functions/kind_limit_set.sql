-- Sets a job kind's limits (forge.kind_limits). p_by NULL: the code's values (the kind's
-- declared options), written by a node at start; they replace the code's earlier values but
-- never an operator's (the operator's win until forge.kind_limit_reset), and no limits at all
-- remove the code's row. p_by set: an operator's values (no limits at all included), recorded
-- in the audit trail. Returns whether the values were written.
--
-- Under the kind's limit lock (forge.jobs_step), so no claim of the kind's limited jobs is under
-- way: the kind's running attempts are given slots (forge.kind_slots) as if claimed under the
-- limit, to be counted by the next claims (an attempt claimed before the kind had a global
-- limit counts from now on; one whose claim saw no limit and commits after this, uncounted,
-- ends as usual). Without a global limit the kind's slots are deleted. Every
-- queue worker of the namespace is woken: a raised or removed limit lets them claim more.
CREATE OR REPLACE FUNCTION forge.kind_limit_set(
    p_namespace text, p_kind text, p_global integer, p_rate_count integer,
    p_rate_window_ms bigint, p_rate_key text, p_by text
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('forge.kind_limit'),
                                  hashtext(p_namespace || ' ' || p_kind));
    IF p_by IS NULL AND EXISTS (SELECT 1 FROM forge.kind_limits l
                                 WHERE l.namespace = p_namespace AND l.kind = p_kind
                                   AND l.set_by IS NOT NULL) THEN
        RETURN false;
    END IF;
    IF p_by IS NULL AND p_global IS NULL AND p_rate_count IS NULL THEN
        DELETE FROM forge.kind_limits l WHERE l.namespace = p_namespace AND l.kind = p_kind;
        IF NOT FOUND THEN
            -- Nothing was limited, nothing changes: no claim needs waking.
            RETURN true;
        END IF;
    ELSE
        INSERT INTO forge.kind_limits AS l (namespace, kind, global_concurrency, rate_count,
                                            rate_window_ms, rate_key, set_at, set_by)
        VALUES (p_namespace, p_kind, p_global, p_rate_count, p_rate_window_ms, p_rate_key,
                clock_timestamp(), p_by)
        ON CONFLICT (namespace, kind) DO UPDATE
           SET global_concurrency = EXCLUDED.global_concurrency,
               rate_count = EXCLUDED.rate_count, rate_window_ms = EXCLUDED.rate_window_ms,
               rate_key = EXCLUDED.rate_key, set_at = EXCLUDED.set_at, set_by = EXCLUDED.set_by
         WHERE (l.global_concurrency, l.rate_count, l.rate_window_ms, l.rate_key, l.set_by)
               IS DISTINCT FROM (EXCLUDED.global_concurrency, EXCLUDED.rate_count,
                                 EXCLUDED.rate_window_ms, EXCLUDED.rate_key, EXCLUDED.set_by);
    END IF;
    IF p_rate_count IS NULL THEN
        DELETE FROM forge.kind_claims c WHERE c.namespace = p_namespace AND c.kind = p_kind;
    END IF;
    IF p_global IS NOT NULL THEN
        INSERT INTO forge.kind_slots (namespace, kind, job_id, attempt)
        SELECT j.namespace, j.kind, j.id, j.attempt FROM forge.jobs_running(p_namespace, NULL) j
         WHERE j.kind = p_kind
           AND j.role IS NULL
        ON CONFLICT (namespace, kind, job_id) DO UPDATE SET attempt = EXCLUDED.attempt;
    ELSE
        DELETE FROM forge.kind_slots s WHERE s.namespace = p_namespace AND s.kind = p_kind;
    END IF;
    PERFORM forge.kind_limit_wake(p_namespace);
    IF p_by IS NOT NULL THEN
        PERFORM forge.audit(p_namespace, 'limit_kind', p_kind, p_by,
                            jsonb_build_object('global_concurrency', p_global,
                                               'rate_count', p_rate_count,
                                               'rate_window_ms', p_rate_window_ms,
                                               'rate_key', p_rate_key));
    END IF;
    RETURN true;
END;
$$;
