-- Gives a job kind's limits back to the code: removes an operator's values
-- (forge.kind_limits), recorded in the audit trail. The kind is then unlimited until a node
-- starts and writes its declared values (forge.kind_limit_set). Returns whether an operator's
-- values were there.
CREATE OR REPLACE FUNCTION forge.kind_limit_reset(p_namespace text, p_kind text, p_by text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_found boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('forge.kind_limit'),
                                  hashtext(p_namespace || ' ' || p_kind));
    DELETE FROM forge.kind_limits l
     WHERE l.namespace = p_namespace AND l.kind = p_kind AND l.set_by IS NOT NULL;
    v_found := FOUND;
    DELETE FROM forge.kind_claims c WHERE c.namespace = p_namespace AND c.kind = p_kind;
    DELETE FROM forge.kind_slots s WHERE s.namespace = p_namespace AND s.kind = p_kind;
    PERFORM forge.kind_limit_wake(p_namespace);
    PERFORM forge.audit(p_namespace, 'reset_kind_limits', p_kind, p_by, '{}');
    RETURN v_found;
END;
$$;
