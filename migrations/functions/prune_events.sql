-- The log compactor's pruner of the cluster's history: deletes at most p_limit events older
-- than the retention, fenced by the compactor's tenure, and returns how many it deleted.
CREATE OR REPLACE FUNCTION forge.prune_events(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.events e
         WHERE e.id IN (SELECT x.id FROM forge.events x
                         WHERE x.namespace = p_namespace
                           AND x.at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         ORDER BY x.id LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) FROM d;
$$;
