-- Gives a queue's limits back to forge.toml: removes an operator's values (forge.queue_limits),
-- recorded in the audit trail. The queue is then unlimited until a node starts and writes
-- forge.toml's values (forge.queue_limit_set). Returns whether an operator's values were there.
CREATE OR REPLACE FUNCTION forge.queue_limit_reset(p_namespace text, p_queue text, p_by text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_found boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('forge.queue_limit'),
                                  hashtext(p_namespace || ' ' || p_queue));
    DELETE FROM forge.queue_limits l
     WHERE l.namespace = p_namespace AND l.queue = p_queue AND l.set_by IS NOT NULL;
    v_found := FOUND;
    DELETE FROM forge.queue_claims c WHERE c.namespace = p_namespace AND c.queue = p_queue;
    DELETE FROM forge.queue_slots s WHERE s.namespace = p_namespace AND s.queue = p_queue;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || p_queue);
    PERFORM forge.audit(p_namespace, 'reset_queue_limits', p_queue, p_by, '{}');
    RETURN v_found;
END;
$$;
