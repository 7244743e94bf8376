-- Forgets nodes that stopped or went down longer than the retention ago (and their counter
-- cursors), recording node_forgotten; fenced by the compactor's tenure.
CREATE OR REPLACE FUNCTION forge.prune_nodes(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.nodes n
         WHERE n.namespace = p_namespace
           AND n.node_id IN (SELECT x.node_id FROM forge.nodes x
                              WHERE x.namespace = p_namespace
                                AND coalesce(x.stopped_at, x.down_at)
                                    < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                                -- (Its lanes' lists go with it: not while they name a
                                -- running job, which rescue has yet to give back.)
                                AND NOT EXISTS (SELECT 1 FROM forge.jobs_running(p_namespace, x.node_id))
                              LIMIT p_limit)
        RETURNING n.node_id, n.stopped_at, n.down_at, n.down_reason
    ), e AS (
        INSERT INTO forge.events (namespace, kind, node_id, detail)
        SELECT p_namespace, 'node_forgotten', d.node_id,
               jsonb_build_object('stopped_at', d.stopped_at, 'down_at', d.down_at,
                                  'down_reason', d.down_reason)
          FROM d
        RETURNING node_id
    ), c AS (
        DELETE FROM forge.stats_cursor sc
         WHERE sc.namespace = p_namespace AND sc.node_id IN (SELECT node_id FROM e)
    )
    SELECT count(*) FROM e;
$$;
