-- Prunes finished ticks older than the retention, keeping the newest tick of every cron (a new
-- leader resumes after it); fenced by the compactor's tenure.
CREATE OR REPLACE FUNCTION forge.prune_ticks(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.cron_ticks t
         WHERE (t.namespace, t.cron, t.scheduled_at) IN (
               SELECT x.namespace, x.cron, x.scheduled_at FROM forge.cron_ticks x
                WHERE x.namespace = p_namespace AND x.finished_at IS NOT NULL
                  AND x.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                  AND x.scheduled_at < (SELECT max(m.scheduled_at) FROM forge.cron_ticks m
                                         WHERE m.namespace = x.namespace AND m.cron = x.cron)
                LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) FROM d;
$$;
