-- Completes a tick inside the handler's own transaction: fenced, and marks the tick
-- succeeded, so the handler's writes and the tick's outcome commit together (or not at all),
-- with when the handler started (p_started; its duration is recorded by the later outcome).
-- Raises FG001 when the tenure is no longer current and FG002 when the tick is not running
-- under this tenure.
DROP FUNCTION IF EXISTS forge.tick_complete(text, text, bigint, bigint, text, timestamptz);
CREATE OR REPLACE FUNCTION forge.tick_complete(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_cron      text,
    p_tick      timestamptz,
    p_started   timestamptz
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_mark text;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    v_mark := format('tick %s %s %s %s', p_namespace, p_cron, p_tick, p_tenure);
    -- Succeeded already counts only when this transaction recorded it: a second transaction
    -- of the same run (a retry after an error from COMMIT that had in fact committed) must
    -- fail, or it would commit the handler's effects twice.
    UPDATE forge.cron_ticks t
       SET state = 'succeeded', finished_at = clock_timestamp(), error = NULL,
           started_at = p_started
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
       AND t.tenure = p_tenure
       AND (t.state = 'running' OR (t.state = 'succeeded' AND forge.tx_marked(v_mark)));
    IF FOUND THEN
        PERFORM forge.tx_mark(v_mark);
    ELSE
        RAISE EXCEPTION USING
            ERRCODE = 'FG002',
            MESSAGE = format('tick %s of cron %s is not running under this leadership', p_tick, p_cron);
    END IF;
END;
$$;
