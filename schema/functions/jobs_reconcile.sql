-- A worker's check of its own running jobs, after a failed round trip or a LISTEN outage:
-- jobs running on this node for this worker that the worker does not know (a claim whose
-- response was lost, an ended role tenure) are rescued; for the jobs it knows, it learns
-- which were cancelled ('cancel') or taken away from it ('gone'). Role workers (p_queue NULL:
-- all queues of the role) also rescue jobs of their role left running under another tenure,
-- on any node.
CREATE OR REPLACE FUNCTION forge.jobs_reconcile(
    p_namespace            text,
    p_node                 text,
    p_queue                text,
    p_role                 text,
    p_tenure               bigint,
    p_ids                  bigint[],
    p_attempts             integer[],
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
BEGIN
    SELECT array_agg(j.id), array_agg(j.attempt),
           array_agg(CASE WHEN j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure
                          THEN 'orphaned: claimed by node ' || p_node || ' but not running there'
                          ELSE 'the leadership of role ' || j.role || ' at epoch ' || j.epoch || ' ended' END)
      INTO v_ids, v_attempts, v_reasons
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.state = 'running'
       AND (p_queue IS NULL OR j.queue = p_queue) AND j.role IS NOT DISTINCT FROM p_role
       AND ((j.node_id = p_node AND NOT (j.id = ANY (p_ids)))
            OR (p_role IS NOT NULL AND j.tenure IS DISTINCT FROM p_tenure));
    IF v_ids IS NOT NULL THEN
        PERFORM forge.jobs_rescue(v_ids, v_attempts, v_reasons, p_default_max_attempts);
    END IF;

    RETURN QUERY
    SELECT k.id, CASE WHEN j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node
                           OR j.attempt <> k.attempt THEN 'gone'
                      ELSE 'cancel' END
      FROM unnest(p_ids, p_attempts) AS k(id, attempt)
      LEFT JOIN forge.jobs j ON j.id = k.id
     WHERE j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node OR j.attempt <> k.attempt
        OR j.cancel_requested;
END;
$$;
