-- Takes over a tick an earlier tenure left running (rerun: attempt + 1) or marks it abandoned,
-- fenced. Returns the tick's attempt number when this tenure took it.
--
-- Fenced: raises FG001 when this tenure is not the current one (NULL then meant two things, and
-- the leader could not tell); NULL means no earlier tenure's run of the tick is left.
CREATE OR REPLACE FUNCTION forge.tick_reclaim(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz,
    p_rerun     boolean
) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_attempt integer;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    UPDATE forge.cron_ticks t
       SET attempt = t.attempt + CASE WHEN p_rerun THEN 1 ELSE 0 END,
           epoch = p_epoch, tenure = p_tenure, node_id = p_node,
           state = CASE WHEN p_rerun THEN 'running' ELSE 'abandoned' END,
           claimed_at = clock_timestamp(),
           finished_at = CASE WHEN p_rerun THEN NULL ELSE clock_timestamp() END,
           error = CASE WHEN p_rerun THEN NULL
                        ELSE 'interrupted by the loss of the leadership of epoch ' || t.epoch END
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
       AND t.state = 'running' AND t.tenure <> p_tenure
    RETURNING t.attempt INTO v_attempt;
    RETURN v_attempt;
END;
$$;
