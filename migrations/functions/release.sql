-- Graceful handoff: mark the lease released, record it, notify, and unlock, in one round trip.
-- The unlock takes effect at once; a waiting follower's epoch bump then waits for this
-- transaction's row lock, so it sees released_at set.
--
-- p_to: a placement move (forge.placement_move) names the node the role is for, with why: for
-- p_window_ms another waiter granted the lock passes it on (forge.campaign), so the named
-- node, a standby waiting behind it, takes it; a leader_rebalanced event records the move.
DROP FUNCTION IF EXISTS forge.release(text, text, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION forge.release(
    p_namespace text,
    p_role      text,
    p_key       bigint,
    p_epoch     bigint,
    p_tenure    bigint,
    p_to        text,
    p_why       text,
    p_window_ms bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    at_time timestamptz := clock_timestamp();
    v_node  text;
BEGIN
    UPDATE forge.leaders l
       SET released_at = at_time, lease_until = at_time,
           handoff_to = p_to,
           handoff_until = CASE WHEN p_to IS NOT NULL
                                THEN at_time + p_window_ms * interval '1 millisecond' END
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.tenure = p_tenure AND l.backend_pid = pg_backend_pid()
    RETURNING l.node_id INTO v_node;
    IF FOUND THEN
        INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
        VALUES (at_time, p_namespace, 'leader_released', v_node, p_role, p_epoch,
                jsonb_build_object('tenure_ms', round(extract(epoch FROM at_time - (
                    SELECT l.acquired_at FROM forge.leaders l
                     WHERE l.namespace = p_namespace AND l.role = p_role)) * 1000)));
        IF p_to IS NOT NULL THEN
            INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
            VALUES (at_time, p_namespace, 'leader_rebalanced', v_node, p_role, p_epoch,
                    jsonb_build_object('to', p_to, 'why', p_why));
        END IF;
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', p_epoch,
            'event', 'released')::text);
    END IF;
    PERFORM pg_advisory_unlock(p_key);
    RETURN v_node IS NOT NULL;
END;
$$;
