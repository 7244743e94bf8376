-- Claims a manual tick (see tick_claim) and clears the request it answers, whatever the
-- claim's outcome: a request is answered once.
CREATE OR REPLACE FUNCTION forge.tick_claim_manual(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz
) RETURNS TABLE (outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_outcome text;
    v_early   double precision;
BEGIN
    SELECT c.outcome, c.early_ms INTO v_outcome, v_early
      FROM forge.tick_claim(p_namespace, p_role, p_epoch, p_tenure, p_node, p_cron, p_tick,
                            'running', NULL) c;
    IF v_outcome IN ('claimed', 'ours', 'taken') THEN
        UPDATE forge.cron_ticks t SET manual = true
         WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
           AND v_outcome = 'claimed';
        UPDATE forge.crons c SET trigger_requested_at = NULL, trigger_requested_by = NULL
         WHERE c.namespace = p_namespace AND c.name = p_cron AND c.trigger_requested_at = p_tick;
        PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_cron);
    END IF;
    RETURN QUERY SELECT v_outcome, v_early;
END;
$$;
