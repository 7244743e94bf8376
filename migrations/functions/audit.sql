-- The audit trail: an operator's write (through the admin API or the CLI), recorded in the
-- events history in the transaction of the write itself.
CREATE OR REPLACE FUNCTION forge.audit(
    p_namespace text, p_action text, p_subject text, p_by text, p_detail jsonb
) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO forge.events (namespace, kind, detail)
    VALUES (p_namespace, 'admin_action',
            jsonb_build_object('action', p_action, 'subject', p_subject, 'by', p_by)
              || coalesce(p_detail, '{}'::jsonb));
$$;
