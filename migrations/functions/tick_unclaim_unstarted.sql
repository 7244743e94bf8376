-- At the start of a tenure: deletes the claims of older tenures of the role that were never
-- started - still running, not manual, instant at or after this tenure's acquired_at (see
-- forge.tick_gate for the rule) - so that this tenure claims and runs them on time. Fenced.
-- Returns the deleted ticks.
CREATE OR REPLACE FUNCTION forge.tick_unclaim_unstarted(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint
) RETURNS TABLE (cron text, scheduled_at timestamptz, epoch bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    RETURN QUERY
    DELETE FROM forge.cron_ticks t
     WHERE t.namespace = p_namespace AND t.role = p_role AND t.state = 'running'
       AND NOT t.manual AND t.tenure <> p_tenure
       AND t.scheduled_at >= (SELECT l.acquired_at FROM forge.leaders l
                               WHERE l.namespace = p_namespace AND l.role = p_role)
    RETURNING t.cron, t.scheduled_at, t.epoch;
END;
$$;
