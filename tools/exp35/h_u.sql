-- HU: the unlogged claims table (u_claim.sql), completion kept by a move into the history.
DO $do$ BEGIN EXECUTE format($f$
CREATE OR REPLACE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void
LANGUAGE plpgsql AS $b$
BEGIN
    IF NOT p_keep THEN
        DELETE FROM forge.jobs j USING exp.claims c
         WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes' AND j.id = c.job_id;
    ELSE
        WITH d AS (DELETE FROM forge.jobs j USING exp.claims c
                    WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes' AND j.id = c.job_id
                   RETURNING j.*, c.node_id AS c_node, c.claimed_at AS c_claimed,
                             c.started_at AS c_started)
        INSERT INTO exp.jobs_history SELECT %s FROM d;
    END IF;
    DELETE FROM exp.claims c WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes';
END $b$ $f$, exp.history_select('{"state": "''completed''", "finished_at": "clock_timestamp()",
    "attempt": "d.attempt + 1", "node_id": "d.c_node", "attempted_at": "d.c_claimed",
    "started_at": "d.c_started"}'));
END $do$;
