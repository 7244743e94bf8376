-- The scheduler leader's look at membership, fenced by its tenure, on its lock session. The
-- leader judges, on its own monotonic clock, from what it saw at its earlier looks (the Rust
-- side, forge_core::membership: a new leader has seen nothing, so it waits a full down_after
-- before it marks anyone down by silence); this function applies its verdicts and reports what
-- it sees now. A verdict names a node and the heartbeat it saw (heartbeat_at, as a value: every
-- heartbeat writes a new one), and is applied only if that is still the node's last heartbeat -
-- the row is locked, so a heartbeat lands before (the verdict does nothing) or after (it finds
-- the node down and rejoins):
--   drifted       its heartbeat was seen unchanged for drift_after;
--   no_heartbeat  down: its heartbeat was seen unchanged for down_after;
--   session_ended down: it was seen gone for a grace (below), and is still gone.
-- No wall clock decides: a step of the server's clock marks no live node drifted or down, and
-- delays no rescue.
--
-- Gone: its node session ended while this server stayed up, and nothing of it is left. The node
-- session is not alive (its pid with the same backend_start); the node's last heartbeat was
-- written on this run of the server (forge.server_run, a value) - so its sessions ended while
-- the server stayed up, not in a restart, a crash restart or a failover that every node
-- reconnects from; and no other session of the node is left (forge.node_backends: its pool, its
-- lock sessions; a node whose handlers still run holds pool sessions). session_lost_at records
-- when the watch first saw it gone (a report).
--
-- A node marked down has its remaining sessions ended before the notification that starts the
-- rescue: row locks a frozen process's open transactions hold would otherwise stall the rescue
-- of its jobs.
--
-- Returns one row per node neither stopped nor down before this look: its last heartbeat, whether
-- it is gone and drifted now, and the change made (down or drifted, with the reason), if any.
DROP FUNCTION IF EXISTS forge.nodes_watch(text, text, bigint, bigint, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION forge.nodes_watch(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_nodes     text[],
    p_beats     timestamptz[],
    p_verdicts  text[],
    p_silent_ms bigint[]
) RETURNS TABLE (node_id text, heartbeat_at timestamptz, gone boolean, drifted boolean,
                 change text, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_server  text := forge.server_run();
    v_now     timestamptz := clock_timestamp();
    n         record;
    v_gone    boolean;
    v_why     text;
    v_detail  jsonb;
    v_pids    integer[];
    v_names   jsonb;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    FOR n IN SELECT nd.*, v.verdict, v.silent_ms
               FROM forge.nodes nd
               LEFT JOIN unnest(p_nodes, p_beats, p_verdicts, p_silent_ms)
                         AS v(node_id, beat, verdict, silent_ms)
                 ON v.node_id = nd.node_id AND v.beat = nd.heartbeat_at
              WHERE nd.namespace = p_namespace AND nd.stopped_at IS NULL AND nd.down_at IS NULL
              ORDER BY nd.node_id FOR UPDATE OF nd
    LOOP
        -- pg_stat_get_activity(NULL) would list every backend: a row without a session is
        -- not alive. A session of another database user shows no backend_start; count it alive.
        v_gone := n.heartbeat_server = v_server
                  AND NOT (n.session_pid IS NOT NULL
                           AND EXISTS (SELECT 1 FROM pg_stat_get_activity(n.session_pid) a
                                        WHERE a.backend_start IS NULL
                                           OR a.backend_start = n.session_start))
                  AND NOT EXISTS (SELECT 1 FROM forge.node_backends(p_namespace, n.node_id));
        IF v_gone AND n.session_lost_at IS NULL THEN
            UPDATE forge.nodes nd SET session_lost_at = v_now
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
        ELSIF NOT v_gone AND n.session_lost_at IS NOT NULL THEN
            UPDATE forge.nodes nd SET session_lost_at = NULL
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
        END IF;
        v_why := CASE
            WHEN n.verdict = 'session_ended' AND v_gone THEN 'session_ended'
            WHEN n.verdict = 'no_heartbeat' THEN 'no_heartbeat' END;
        IF v_why IS NOT NULL THEN
            UPDATE forge.nodes nd
               SET down_at = v_now,
                   down_reason = CASE v_why
                       WHEN 'session_ended' THEN 'its node session ended (process killed or crashed) and it did not reconnect'
                       ELSE format('no heartbeat for %s s (seen by the scheduler leader)',
                                   round(n.silent_ms / 1000.0, 1)) END
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
            v_detail := jsonb_build_object(
                'reason', v_why, 'last_heartbeat', n.heartbeat_at, 'silent_ms', n.silent_ms,
                'session_lost_at', CASE WHEN v_gone THEN coalesce(n.session_lost_at, v_now) END,
                'by_epoch', p_epoch, 'ended_sessions', v_names);
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_down', n.node_id, v_detail);
            PERFORM pg_notify('forge_nodes', p_namespace || ' down ' || n.node_id);
            RETURN QUERY SELECT n.node_id, n.heartbeat_at, v_gone, n.drifted_at IS NOT NULL,
                                'down'::text, v_why;
        ELSIF n.verdict = 'drifted' AND n.drifted_at IS NULL THEN
            UPDATE forge.nodes nd SET drifted_at = v_now
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_drifted', n.node_id, jsonb_build_object(
                'last_heartbeat', n.heartbeat_at, 'silent_ms', n.silent_ms));
            RETURN QUERY SELECT n.node_id, n.heartbeat_at, v_gone, true, 'drifted'::text,
                                'no_heartbeat'::text;
        ELSE
            RETURN QUERY SELECT n.node_id, n.heartbeat_at, v_gone, n.drifted_at IS NOT NULL,
                                NULL::text, NULL::text;
        END IF;
    END LOOP;
END;
$$;
