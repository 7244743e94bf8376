-- Claims a tick for a tenure, with a note recorded as the row's error (why a tick recorded as
-- skipped was skipped: 'paused', or the previous run still going). Returns
--   'claimed'  inserted now: run it;
--   'ours'     this tenure had claimed it already (the reply to that claim was lost): run it;
--   'taken'    claimed by another tenure, or already recorded with another state;
--   'early'    not due yet by the database's clock (this node's clock runs ahead): retry in
--              early_ms;
--   'fenced'   the tenure is not the role's current leadership.
CREATE OR REPLACE FUNCTION forge.tick_claim(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz,
    p_state     text,
    p_note      text
) RETURNS TABLE (outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_tenure bigint;
    v_state  text;
BEGIN
    IF p_tick > clock_timestamp() THEN
        RETURN QUERY SELECT 'early'::text,
                            extract(epoch FROM p_tick - clock_timestamp())::double precision * 1000;
        RETURN;
    END IF;
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::double precision;
        RETURN;
    END IF;
    INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id,
                                  state, finished_at, error)
    VALUES (p_namespace, p_cron, p_tick, p_role, p_epoch, p_tenure, p_node, p_state,
            CASE WHEN p_state = 'running' THEN NULL ELSE clock_timestamp() END, p_note)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT 'claimed'::text, NULL::double precision;
        RETURN;
    END IF;
    SELECT t.tenure, t.state INTO v_tenure, v_state FROM forge.cron_ticks t
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick;
    RETURN QUERY SELECT CASE WHEN v_tenure = p_tenure AND v_state = p_state THEN 'ours'
                             ELSE 'taken' END, NULL::double precision;
END;
$$;
