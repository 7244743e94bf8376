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
--
-- Asked every heartbeat interval by every leading node, so the settled case is cheap: the
-- standbys (pg_locks, pg_stat_activity) are looked at only when a move is possible. It rides on
-- the heartbeat's statement: an error here is a warning and no move, never a failed heartbeat.
CREATE OR REPLACE FUNCTION forge.placement_move(
    p_namespace   text,
    p_node        text,
    p_spread      boolean,
    p_pace_ms     bigint,
    p_cooldown_ms bigint
) RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_leads   bigint;
    v_share   numeric;
    v_prefers text[];
    v_move    text[];
BEGIN
    -- One move at a time in the cluster, paced.
    IF EXISTS (SELECT 1 FROM forge.leaders l
                WHERE l.namespace = p_namespace
                  AND (l.handoff_until > v_now
                       OR l.moved_at > v_now - p_pace_ms * interval '1 millisecond')) THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_leads FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.node_id = p_node AND forge.tenure_current(l);
    SELECT ceil(count(DISTINCT r)::numeric / greatest(count(DISTINCT n.node_id), 1))
      INTO v_share
      FROM forge.nodes n LEFT JOIN LATERAL unnest(n.roles) AS r ON true
     WHERE n.namespace = p_namespace AND n.stopped_at IS NULL AND n.down_at IS NULL
       AND n.drifted_at IS NULL AND cardinality(n.roles) > 0;
    SELECT coalesce(n.prefers, '{}') INTO v_prefers FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node;
    v_prefers := coalesce(v_prefers, '{}');
    -- Nothing to spread, and no live node prefers a role this node leads without preferring
    -- it: settled.
    IF NOT (p_spread AND v_leads > v_share) AND NOT EXISTS (
           SELECT 1 FROM forge.leaders l
             JOIN forge.nodes n ON n.namespace = l.namespace AND l.role = ANY (n.prefers)
            WHERE l.namespace = p_namespace AND l.node_id = p_node AND l.released_at IS NULL
              AND n.node_id <> p_node AND n.stopped_at IS NULL AND n.down_at IS NULL
              AND NOT (l.role = ANY (v_prefers))) THEN
        RETURN NULL;
    END IF;
    WITH led AS (
        SELECT l.node_id, count(*) AS n FROM forge.leaders l
         WHERE l.namespace = p_namespace AND forge.tenure_current(l)
         GROUP BY l.node_id
    ), live AS (
        SELECT n.node_id, n.prefers FROM forge.nodes n
         WHERE n.namespace = p_namespace AND n.stopped_at IS NULL AND n.down_at IS NULL
           AND n.drifted_at IS NULL AND cardinality(n.roles) > 0
    ), mine AS (
        SELECT l.role, l.lock_key, l.moved_at FROM forge.leaders l
         WHERE l.namespace = p_namespace AND l.node_id = p_node AND forge.tenure_current(l)
           AND NOT (l.role = ANY (v_prefers))
           AND (l.moved_at IS NULL
                OR l.moved_at < v_now - p_cooldown_ms * interval '1 millisecond')
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
    )
    SELECT ARRAY[w.role, w.node_id,
                 CASE WHEN w.role = ANY (t.prefers) THEN 'preferred' ELSE 'spread' END]
      INTO v_move
      FROM waiting w
      JOIN live t ON t.node_id = w.node_id
      LEFT JOIN led tl ON tl.node_id = w.node_id
     WHERE w.node_id <> p_node
       AND (w.role = ANY (t.prefers)
            OR (p_spread AND v_leads > v_share AND coalesce(tl.n, 0) < v_share))
     ORDER BY w.role = ANY (t.prefers) DESC, coalesce(tl.n, 0), w.role, w.node_id
     LIMIT 1;
    RETURN v_move;
EXCEPTION WHEN OTHERS THEN
    -- It rides on the heartbeat's statement: a failure here must never fail the heartbeat.
    RAISE WARNING 'forge.placement_move: % (%)', SQLERRM, SQLSTATE;
    RETURN NULL;
END;
$$;
