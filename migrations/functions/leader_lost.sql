-- A leader that lost its leadership without handing over says so (best effort, once it can):
-- detail.reason is what it saw (deadline, deposed, renewal_failed).
CREATE OR REPLACE FUNCTION forge.leader_lost(
    p_namespace text, p_role text, p_node text, p_epoch bigint, p_tenure bigint, p_reason text
) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO forge.events (namespace, kind, node_id, role, epoch, detail)
    VALUES (p_namespace, 'leader_lost', p_node, p_role, p_epoch,
            jsonb_build_object('reason', p_reason, 'tenure', p_tenure));
$$;
