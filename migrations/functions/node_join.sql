-- A node joins (first start) or rejoins (its node session reconnected) on its node session,
-- which already holds the node's advisory lock. Returns what the row said before. A new
-- incarnation starts with an empty tally, so that the previous process's counters are never
-- merged with or read beside the new one's (node_heartbeat merges changed counters).
-- p_prefers: the roles the node prefers to lead (forge.placement_move); p_work_roles: the roles
-- its binary has work for, campaigned for or not (p_roles).
DROP FUNCTION IF EXISTS forge.node_join(text, text, bigint, text, integer, text, text[], jsonb, text);
DROP FUNCTION IF EXISTS forge.node_join(text, text, bigint, text, integer, text, text[], jsonb, text, text[]);
CREATE OR REPLACE FUNCTION forge.node_join(
    p_namespace   text,
    p_node        text,
    p_incarnation bigint,
    p_hostname    text,
    p_pid         integer,
    p_version     text,
    p_roles       text[],
    p_queues      jsonb,
    p_admin_url   text,
    p_prefers     text[],
    p_work_roles  text[]
) RETURNS TABLE (previous_incarnation bigint, previous_stopped boolean, was_down boolean,
                 server_now timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    prev     forge.nodes%ROWTYPE;
    at_time  timestamptz := clock_timestamp();
    my_start timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    v_kind   text;
BEGIN
    SELECT * INTO prev FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node FOR UPDATE;
    INSERT INTO forge.nodes AS n (namespace, node_id, started_at, heartbeat_at, heartbeat_server,
                                  queues, incarnation, hostname, pid, version, roles, work_roles,
                                  prefers, admin_url, session_pid, session_start, server_started_at)
    VALUES (p_namespace, p_node, at_time, at_time, forge.server_run(), p_queues, p_incarnation,
            p_hostname, p_pid, p_version, p_roles, p_work_roles, p_prefers, p_admin_url,
            pg_backend_pid(), my_start, pg_postmaster_start_time())
    ON CONFLICT (namespace, node_id) DO UPDATE
       SET started_at = CASE WHEN n.incarnation IS DISTINCT FROM p_incarnation
                             THEN at_time ELSE n.started_at END,
           heartbeat_at = at_time, heartbeat_server = excluded.heartbeat_server, stopped_at = NULL,
           queues = excluded.queues,
           incarnation = excluded.incarnation, hostname = excluded.hostname, pid = excluded.pid,
           version = excluded.version, roles = excluded.roles, work_roles = excluded.work_roles,
           prefers = excluded.prefers,
           admin_url = excluded.admin_url,
           session_pid = excluded.session_pid, session_start = excluded.session_start,
           server_started_at = excluded.server_started_at, session_lost_at = NULL,
           drifted_at = NULL, down_at = NULL, down_reason = NULL,
           -- A new process counts from zero: its first heartbeat's counters must not be
           -- merged into, or read beside, the previous incarnation's.
           tally = CASE WHEN n.incarnation IS DISTINCT FROM p_incarnation
                        THEN '{}'::jsonb ELSE n.tally END;
    v_kind := CASE
        WHEN prev.node_id IS NULL OR prev.incarnation IS DISTINCT FROM p_incarnation THEN 'node_joined'
        WHEN prev.down_at IS NOT NULL THEN 'node_rejoined'
        END;
    IF v_kind IS NOT NULL THEN
        INSERT INTO forge.events (at, namespace, kind, node_id, detail)
        VALUES (at_time, p_namespace, v_kind, p_node, jsonb_build_object(
            'hostname', p_hostname, 'pid', p_pid, 'version', p_version, 'roles', p_roles,
            'previous_incarnation_stopped', prev.stopped_at IS NOT NULL,
            'was_down', prev.down_at IS NOT NULL, 'down_reason', prev.down_reason));
    END IF;
    RETURN QUERY SELECT prev.incarnation, prev.stopped_at IS NOT NULL, prev.down_at IS NOT NULL,
                        at_time;
END;
$$;
