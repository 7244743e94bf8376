-- A heartbeat, on the node session, with the node's cumulative counters. Returns false when
-- the row is not this incarnation's any more or the node was marked down (the node then
-- rejoins: its running jobs were rescued).
--
-- What the scheduler leader's watch reads of it (forge.nodes_watch): heartbeat_at as a value
-- that every heartbeat changes (never as a time: the leader measures silence on its own clock)
-- and heartbeat_server, the run of the server it was written on (forge.server_run).
--
-- Only the counters that changed are sent: a node's tally has a few keys per queue and per
-- role (cron series are counted by role; by cron, 10,000 crons made 40,000 keys, a megabyte
-- of JSON to parse and store every few seconds if sent whole). p_all = false merges the changed counters into the stored object
-- (values are cumulative, so a counter sent twice is harmless); true replaces it (the node's
-- first heartbeat after one that may not have landed).
--
-- p_via_pool: sent on a pool connection because the node session is down and cannot be
-- reopened (the server refuses new connections, its flows are cut): it proves the process
-- alive and keeps its jobs its own, without being the session that holds the node's id (that
-- lock is then free; a twin that takes it changes the incarnation, and this heartbeat answers
-- false).
DROP FUNCTION IF EXISTS forge.node_heartbeat(text, text, bigint, text[], jsonb, boolean);
CREATE OR REPLACE FUNCTION forge.node_heartbeat(
    p_namespace   text,
    p_node        text,
    p_incarnation bigint,
    p_leads       text[],
    p_tally       jsonb,
    p_all         boolean,
    p_via_pool    boolean
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_drifted timestamptz;
    v_down    timestamptz;
BEGIN
    SELECT n.drifted_at, n.down_at INTO v_drifted, v_down FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node AND n.incarnation = p_incarnation
       AND (p_via_pool OR n.session_pid = pg_backend_pid()) AND n.stopped_at IS NULL
       FOR UPDATE;
    IF NOT FOUND OR v_down IS NOT NULL THEN
        RETURN false;
    END IF;
    -- Nothing changed: the stored object is left as it is (not even rewritten).
    UPDATE forge.nodes n
       SET heartbeat_at = clock_timestamp(), heartbeat_server = forge.server_run(),
           leads = p_leads, drifted_at = NULL,
           server_started_at = pg_postmaster_start_time(),
           tally = CASE WHEN p_all THEN p_tally
                        WHEN p_tally = '{}'::jsonb THEN n.tally
                        ELSE n.tally || p_tally END
     WHERE n.namespace = p_namespace AND n.node_id = p_node;
    IF v_drifted IS NOT NULL THEN
        INSERT INTO forge.events (namespace, kind, node_id, detail)
        VALUES (p_namespace, 'node_recovered', p_node,
                jsonb_build_object('drifted_at', v_drifted));
    END IF;
    RETURN true;
END;
$$;
