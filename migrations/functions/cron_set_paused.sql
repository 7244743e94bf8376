-- Pauses or resumes a cron; tells the leaders at once (channel forge_crons, payload
-- '<namespace> <cron>'). Returns false when no such cron is known.
CREATE OR REPLACE FUNCTION forge.cron_set_paused(
    p_namespace text,
    p_cron      text,
    p_paused    boolean,
    p_by        text
) RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE forge.crons c
       SET paused_at = CASE WHEN p_paused THEN coalesce(c.paused_at, clock_timestamp()) END,
           paused_by = CASE WHEN p_paused THEN coalesce(c.paused_by, p_by) END
     WHERE c.namespace = p_namespace AND c.name = p_cron;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_cron);
    RETURN true;
END;
$$;
