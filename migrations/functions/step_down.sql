-- Asks the current leader of a role to hand over gracefully (any node, or a process that is
-- no node, may ask: the request travels as a notice on forge_leader, which every node hears).
-- Returns the epoch asked, its node and the standbys waiting.
--
-- Refused (asked = false, nothing recorded) when no standby waits inside the role's lock,
-- unless p_force: the role would have no leader until a reserve's heartbeat or the stepped-down
-- node itself campaigned again. Returns no row when the role has no live leader.
DROP FUNCTION IF EXISTS forge.step_down(text, text, text);
CREATE OR REPLACE FUNCTION forge.step_down(p_namespace text, p_role text, p_by text, p_force boolean)
RETURNS TABLE (epoch bigint, node_id text, standbys bigint, asked boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_epoch    bigint;
    v_node     text;
    v_standbys bigint;
BEGIN
    SELECT l.epoch, l.node_id, forge.lock_waiters(l.lock_key) INTO v_epoch, v_node, v_standbys
      FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role AND forge.tenure_current(l);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_standbys = 0 AND NOT p_force THEN
        RETURN QUERY SELECT v_epoch, v_node, v_standbys, false;
        RETURN;
    END IF;
    PERFORM forge.audit(p_namespace, 'step_down', p_role, p_by,
                        jsonb_build_object('epoch', v_epoch, 'node_id', v_node,
                                           'standbys', v_standbys, 'force', p_force));
    PERFORM pg_notify('forge_leader', json_build_object(
        'namespace', p_namespace, 'role', p_role, 'epoch', v_epoch,
        'node', v_node, 'event', 'step_down')::text);
    RETURN QUERY SELECT v_epoch, v_node, v_standbys, true;
END;
$$;
