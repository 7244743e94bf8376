-- Leadership placement, asked with the heartbeat of a node that leads roles: the one role it
-- should hand over now, with the node to hand it to and why, as ARRAY[role, node, why]; NULL
-- when nothing should move. Two reasons, the first first:
--   'preferred'  a node that prefers the role ([node] prefer_roles) waits as its standby, and
--                this node does not prefer it;
--   'spread'     (p_spread) this node leads more roles than its share - the roles the live
--                nodes campaign for divided by the live nodes, rounded up - and a standby of
--                one of them leads fewer than the share (so it leads at most its share after).
-- The move goes to a standby waiting inside the role's lock (forge.release names it, and the
-- lock passes to it). At most one move in the cluster at a time: none while a handoff is in
-- flight or within p_pace_ms of the last move; a tenure that began with a move stays put for
-- p_cooldown_ms. So a cluster settles with every node at or under its share and stays there: a
-- node joining or leaving changes the share by at most one, never back and forth.
CREATE OR REPLACE FUNCTION forge.placement_move(
    p_namespace   text,
    p_node        text,
    p_spread      boolean,
    p_pace_ms     bigint,
    p_cooldown_ms bigint
) RETURNS text[]
LANGUAGE sql
AS $$
    WITH live AS (
        SELECT n.node_id, n.roles, n.prefers FROM forge.nodes n
         WHERE n.namespace = p_namespace AND n.stopped_at IS NULL AND n.down_at IS NULL
           AND n.drifted_at IS NULL AND cardinality(n.roles) > 0
    ), led AS (
        SELECT l.node_id, count(*) AS n FROM forge.leaders l
         WHERE l.namespace = p_namespace AND l.released_at IS NULL
           AND l.lease_until > clock_timestamp()
         GROUP BY l.node_id
    ), share AS (
        SELECT ceil((SELECT count(DISTINCT r) FROM live, unnest(live.roles) AS r)::numeric
                    / greatest((SELECT count(*) FROM live), 1)) AS n
    ), mine AS (
        SELECT l.role, l.lock_key, l.moved_at FROM forge.leaders l
         WHERE l.namespace = p_namespace AND l.node_id = p_node AND l.released_at IS NULL
           AND l.lease_until > clock_timestamp()
    ), waiting AS (
        -- The standbys of this node's roles: sessions waiting for the role's key, named
        -- forge:<role>:<node>.
        SELECT m.role, substr(a.application_name, length('forge:' || m.role || ':') + 1) AS node_id
          FROM mine m
          JOIN pg_locks lk
            ON lk.locktype = 'advisory' AND NOT lk.granted AND lk.objsubid = 1
           AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND lk.classid = ((m.lock_key >> 32) & 4294967295)::oid
           AND lk.objid = (m.lock_key & 4294967295)::oid
          JOIN pg_stat_activity a ON a.pid = lk.pid
         WHERE starts_with(a.application_name, 'forge:' || m.role || ':')
    ), me AS (
        SELECT coalesce((SELECT led.n FROM led WHERE led.node_id = p_node), 0) AS leads,
               coalesce((SELECT live.prefers FROM live WHERE live.node_id = p_node), '{}') AS prefers
    ), moves AS (
        SELECT m.role, w.node_id AS to_node,
               CASE WHEN m.role = ANY (t.prefers) THEN 'preferred' ELSE 'spread' END AS why,
               coalesce(tl.n, 0) AS target_leads
          FROM mine m
          JOIN waiting w ON w.role = m.role
          JOIN live t ON t.node_id = w.node_id
          LEFT JOIN led tl ON tl.node_id = w.node_id
         CROSS JOIN me
         CROSS JOIN share
         WHERE w.node_id <> p_node
           AND NOT (m.role = ANY (me.prefers))
           AND (m.moved_at IS NULL
                OR m.moved_at < clock_timestamp() - p_cooldown_ms * interval '1 millisecond')
           AND (m.role = ANY (t.prefers)
                OR (p_spread AND me.leads > share.n AND coalesce(tl.n, 0) < share.n))
    )
    SELECT ARRAY[mv.role, mv.to_node, mv.why] FROM moves mv
     WHERE NOT EXISTS (
           SELECT 1 FROM forge.leaders l
            WHERE l.namespace = p_namespace
              AND (l.handoff_until > clock_timestamp()
                   OR l.moved_at > clock_timestamp() - p_pace_ms * interval '1 millisecond'))
     ORDER BY mv.why = 'spread', mv.target_leads, mv.role, mv.to_node
     LIMIT 1
$$;
