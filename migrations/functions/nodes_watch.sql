-- The scheduler leader's look at membership, fenced by its tenure. A node is marked
--   drifted  when it has not heartbeated for p_drift_ms;
--   down     when there is evidence it is gone:
--            * its node session ended while this server was up (a backend alive now is
--              older than the node's last heartbeat, on the same server process) and the node
--              did not rejoin within p_grace_ms; or
--            * it has not heartbeated for p_down_ms.
-- Ages are measured from the later of the heartbeat and the leader's lock session start: after
-- a PostgreSQL restart or a failover every node gets the full time to reconnect and heartbeat,
-- however long the outage was.
--
-- Evidence (a) also needs the node to have no session left on the server (forge.node_backends:
-- its pool, its lock sessions; a node whose handlers still run holds pool sessions) and no
-- heartbeat (through its pool) since the loss was seen. A node marked down has its remaining
-- sessions ended before the notification that starts the rescue: row locks a frozen process's
-- open transactions hold would otherwise stall the rescue of its jobs.
CREATE OR REPLACE FUNCTION forge.nodes_watch(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_drift_ms  bigint,
    p_down_ms   bigint,
    p_grace_ms  bigint
) RETURNS TABLE (node_id text, change text, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_since  timestamptz;
    v_now    timestamptz := clock_timestamp();
    v_server timestamptz := pg_postmaster_start_time();
    n        record;
    v_alive  boolean;
    v_age    interval;
    v_why    text;
    v_detail jsonb;
    v_pids   integer[];
    v_names  jsonb;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    SELECT l.backend_start INTO v_since FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role;
    FOR n IN SELECT * FROM forge.nodes nd
              WHERE nd.namespace = p_namespace AND nd.stopped_at IS NULL AND nd.down_at IS NULL
              ORDER BY nd.node_id FOR UPDATE
    LOOP
        v_age := v_now - greatest(n.heartbeat_at, v_since);
        v_why := NULL;
        -- pg_stat_get_activity(NULL) would list every backend: a row without a session is
        -- not alive. A session of another database user shows no backend_start; count it alive.
        v_alive := n.session_pid IS NOT NULL
                   AND EXISTS (SELECT 1 FROM pg_stat_get_activity(n.session_pid) a
                                WHERE a.backend_start IS NULL OR a.backend_start = n.session_start);
        -- Gone while the server stayed up: some backend alive now started before the node's
        -- last heartbeat (a crash restart ends every backend), on the same server process (a
        -- promoted standby has another start time), and nothing of the node is left.
        IF NOT v_alive AND n.server_started_at = v_server
           AND EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a
                        WHERE a.backend_start <= n.heartbeat_at)
           AND NOT EXISTS (SELECT 1 FROM forge.node_backends(p_namespace, n.node_id)) THEN
            IF n.session_lost_at IS NULL OR n.heartbeat_at > n.session_lost_at THEN
                -- (Seen now, or seen before and the node heartbeated since: start again.)
                UPDATE forge.nodes nd SET session_lost_at = v_now
                 WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
                CONTINUE;
            ELSIF v_now - n.session_lost_at >= p_grace_ms * interval '1 millisecond' THEN
                v_why := 'session_ended';
                v_detail := jsonb_build_object('session_lost_at', n.session_lost_at);
            END IF;
        ELSIF n.session_lost_at IS NOT NULL THEN
            UPDATE forge.nodes nd SET session_lost_at = NULL
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
        END IF;
        IF v_why IS NULL AND v_age >= p_down_ms * interval '1 millisecond' THEN
            v_why := 'no_heartbeat';
            v_detail := '{}'::jsonb;
        END IF;
        IF v_why IS NOT NULL THEN
            UPDATE forge.nodes nd
               SET down_at = v_now,
                   down_reason = CASE v_why
                       WHEN 'session_ended' THEN 'its node session ended (process killed or crashed) and it did not reconnect'
                       ELSE format('no heartbeat for %s', date_trunc('second', v_age)) END
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
            -- Whatever the node left open goes now, with its row locks. (The sessions first,
            -- then the terminations: a function call in a WHERE clause may run before the
            -- other conditions, on every row.)
            SELECT coalesce(array_agg(b.pid), '{}'),
                   coalesce(jsonb_agg(b.application_name), '[]'::jsonb)
              INTO v_pids, v_names
              FROM forge.node_backends(p_namespace, n.node_id) b
             WHERE b.pid <> pg_backend_pid();
            PERFORM pg_terminate_backend(x) FROM unnest(v_pids) AS x;
            v_detail := v_detail || jsonb_build_object(
                'reason', v_why, 'last_heartbeat', n.heartbeat_at, 'by_epoch', p_epoch,
                'ended_sessions', v_names);
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_down', n.node_id, v_detail);
            PERFORM pg_notify('forge_nodes', p_namespace || ' down ' || n.node_id);
            RETURN QUERY SELECT n.node_id, 'down'::text, v_why;
        ELSIF v_age >= p_drift_ms * interval '1 millisecond' AND n.drifted_at IS NULL THEN
            UPDATE forge.nodes nd SET drifted_at = v_now
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_drifted', n.node_id, jsonb_build_object(
                'last_heartbeat', n.heartbeat_at));
            RETURN QUERY SELECT n.node_id, 'drifted'::text, 'no_heartbeat'::text;
        END IF;
    END LOOP;
END;
$$;
