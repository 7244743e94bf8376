-- The log compactor's pruner of the cluster series: deletes at most p_limit points older than
-- the retention, fenced by the compactor's tenure, and returns how many it deleted.
CREATE OR REPLACE FUNCTION forge.prune_stats(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.stats s
         WHERE (s.namespace, s.series, s.label, s.at) IN (
               SELECT x.namespace, x.series, x.label, x.at FROM forge.stats x
                WHERE x.namespace = p_namespace
                  AND x.at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) FROM d;
$$;
