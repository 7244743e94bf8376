-- Returns the instant of the pending manual tick (an earlier request still pending is kept),
-- NULL when no such cron is known.
CREATE OR REPLACE FUNCTION forge.cron_trigger(p_namespace text, p_cron text, p_by text) RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    UPDATE forge.crons c
       SET trigger_requested_at = coalesce(c.trigger_requested_at,
                                           date_trunc('milliseconds', clock_timestamp())),
           trigger_requested_by = coalesce(c.trigger_requested_by, p_by)
     WHERE c.namespace = p_namespace AND c.name = p_cron
    RETURNING c.trigger_requested_at INTO v_at;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM forge.audit(p_namespace, 'trigger_cron', p_cron, p_by,
                        jsonb_build_object('scheduled_at', v_at));
    PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_cron);
    RETURN v_at;
END;
$$;
