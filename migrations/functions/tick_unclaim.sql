-- A leader that will not start a tick it claimed ahead (it hands over before the instant)
-- deletes its claim, fenced, so that the tick is not taken for a run cut short. Returns whether
-- a claim was deleted.
CREATE OR REPLACE FUNCTION forge.tick_unclaim(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_cron      text,
    p_tick      timestamptz
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    DELETE FROM forge.cron_ticks t
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
       AND t.tenure = p_tenure AND t.state = 'running' AND NOT t.manual;
    RETURN FOUND;
END;
$$;
