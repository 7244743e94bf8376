-- HS: today's claim (s_claim.sql), completion kept by a move into the history.
DO $do$ BEGIN EXECUTE format($f$
CREATE OR REPLACE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void
LANGUAGE plpgsql AS $b$
BEGIN
    IF NOT p_keep THEN
        DELETE FROM forge.jobs j
         WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes';
        RETURN;
    END IF;
    WITH d AS (DELETE FROM forge.jobs j
                WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes'
               RETURNING j.*)
    INSERT INTO exp.jobs_history SELECT %s FROM d;
END $b$ $f$, exp.history_select('{"state": "''completed''", "finished_at": "clock_timestamp()"}'));
END $do$;
