-- At a node's start: rescues the jobs the node's previous run left running. The node holds its
-- id's advisory lock (its node session) and has joined as incarnation p_incarnation, so no other
-- live process runs them. But a session of the previous run may still be inside a round trip on
-- the server - a claim whose commit waits for a stalled synchronous standby: a pool session does
-- not notice that its client died - and commit after this looked, stranding its jobs on this live
-- node. So first it ends the previous run's pool sessions (application_name forge:pool:<node>,
-- started before this incarnation joined), waiting up to p_wait_ms for each to exit (a commit in
-- progress then completes or rolls back), then takes every lane of the node that another
-- incarnation holds (forge.jobs_lane_take: a claim of the previous run that reaches the server
-- later takes nothing), and only then looks. A session that does not end in time fails the call
-- (the node tries again).
--
-- A row a transaction of the previous run still holds is waited for (that session's
-- idle-in-transaction timeout bounds the wait).
DROP FUNCTION IF EXISTS forge.jobs_rescue_own(text, text, integer);
CREATE OR REPLACE FUNCTION forge.jobs_rescue_own(
    p_namespace            text,
    p_node                 text,
    p_incarnation          bigint,
    p_default_max_attempts integer,
    p_wait_ms              integer
) RETURNS TABLE (id bigint, queue text, kind text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_joined   timestamptz;
    v_old      record;
    v_lane     text;
    v_ids      bigint[];
    v_attempts integer[];
BEGIN
    SELECT n.started_at INTO v_joined FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node AND n.incarnation = p_incarnation;
    IF v_joined IS NULL THEN
        RAISE EXCEPTION 'node % is not joined as this process (incarnation %): another process took its id',
                        p_node, p_incarnation;
    END IF;
    FOR v_old IN SELECT b.pid, b.backend_start FROM forge.node_backends(p_namespace, p_node) b
                  WHERE b.application_name = left('forge:pool:' || p_node, 63)
                    AND b.backend_start < v_joined AND b.pid <> pg_backend_pid() LOOP
        IF NOT pg_terminate_backend(v_old.pid, greatest(p_wait_ms, 1))
           AND EXISTS (SELECT 1 FROM pg_stat_activity a
                        WHERE a.pid = v_old.pid AND a.backend_start = v_old.backend_start) THEN
            RAISE EXCEPTION 'a pool session of node %''s previous run (pid %) did not end within % ms',
                            p_node, v_old.pid, p_wait_ms;
        END IF;
    END LOOP;
    FOR v_lane IN SELECT l.lane FROM forge.job_lanes l
                   WHERE l.namespace = p_namespace AND l.node_id = p_node
                     AND l.incarnation <> p_incarnation LOOP
        PERFORM forge.jobs_lane_take(p_namespace, p_node, v_lane, p_incarnation, p_wait_ms);
    END LOOP;

    SELECT array_agg(j.id), array_agg(j.attempt) INTO v_ids, v_attempts
      FROM forge.jobs_running(p_namespace, p_node) j;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM forge.jobs_rescue(
            v_ids, v_attempts,
            array_fill('node ' || p_node || ' restarted during the attempt', ARRAY[cardinality(v_ids)]),
            array_fill(true, ARRAY[cardinality(v_ids)]),
            p_default_max_attempts, false);
    END IF;
END;
$$;
