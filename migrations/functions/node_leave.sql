-- A graceful stop, after the node's work has drained.
CREATE OR REPLACE FUNCTION forge.node_leave(p_namespace text, p_node text, p_incarnation bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE forge.nodes n
       SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), leads = '{}'
     WHERE n.namespace = p_namespace AND n.node_id = p_node AND n.incarnation = p_incarnation
       AND n.stopped_at IS NULL;
    IF FOUND THEN
        INSERT INTO forge.events (namespace, kind, node_id) VALUES (p_namespace, 'node_left', p_node);
    END IF;
END;
$$;
