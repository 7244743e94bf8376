-- Graceful handoff: mark the lease released, record it, notify, and unlock, in one round trip.
-- The unlock takes effect at once; a waiting follower's epoch bump then waits for this
-- transaction's row lock, so it sees released_at set.
CREATE OR REPLACE FUNCTION forge.release(
    p_namespace text,
    p_role      text,
    p_key       bigint,
    p_epoch     bigint,
    p_tenure    bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    at_time timestamptz := clock_timestamp();
    v_node  text;
BEGIN
    UPDATE forge.leaders l
       SET released_at = at_time, lease_until = at_time
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.tenure = p_tenure AND l.backend_pid = pg_backend_pid()
    RETURNING l.node_id INTO v_node;
    IF FOUND THEN
        INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
        VALUES (at_time, p_namespace, 'leader_released', v_node, p_role, p_epoch,
                jsonb_build_object('tenure_ms', round(extract(epoch FROM at_time - (
                    SELECT l.acquired_at FROM forge.leaders l
                     WHERE l.namespace = p_namespace AND l.role = p_role)) * 1000)));
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', p_epoch,
            'event', 'released')::text);
    END IF;
    PERFORM pg_advisory_unlock(p_key);
    RETURN v_node IS NOT NULL;
END;
$$;
