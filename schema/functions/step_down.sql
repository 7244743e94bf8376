-- Asks the current leader of a role to hand over gracefully (any node, or a process that is
-- no node, may ask: the request travels as a notice on forge_leader, which every node hears).
-- Returns the epoch asked to step down; NULL when the role has no live leader.
CREATE OR REPLACE FUNCTION forge.step_down(p_namespace text, p_role text, p_by text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_epoch bigint;
    v_node  text;
BEGIN
    SELECT l.epoch, l.node_id INTO v_epoch, v_node FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.released_at IS NULL
       AND l.lease_until > clock_timestamp();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM forge.audit(p_namespace, 'step_down', p_role, p_by,
                        jsonb_build_object('epoch', v_epoch, 'node_id', v_node));
    PERFORM pg_notify('forge_leader', json_build_object(
        'namespace', p_namespace, 'role', p_role, 'epoch', v_epoch,
        'node', v_node, 'event', 'step_down')::text);
    RETURN v_epoch;
END;
$$;
