-- The outcomes of the runs of one tenure that end together, recorded in one statement: each
-- only while its tick is running under this tenure, with when its handler started and how long
-- it ran (the leader's measures). One row per tick, in input order (idx, 1-based): 'recorded',
-- the tick's state when it was already final (for example 'succeeded' after the handler
-- completed it in its own transaction: its duration is recorded then), 'taken' (another tenure
-- owns it) or 'missing'.
DROP FUNCTION IF EXISTS forge.tick_finish_many(text, bigint, text[], timestamptz[], text[], text[]);
CREATE OR REPLACE FUNCTION forge.tick_finish_many(
    p_namespace text,
    p_tenure    bigint,
    p_crons     text[],
    p_ticks     timestamptz[],
    p_states    text[],
    p_errors    text[],
    p_started   timestamptz[],
    p_took_ms   double precision[]
) RETURNS TABLE (idx integer, outcome text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_done bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    WITH f AS (
        SELECT x.* FROM unnest(p_crons, p_ticks, p_states, p_errors, p_started, p_took_ms)
                        WITH ORDINALITY AS x(cron, at, state, error, started, took, k)
    ), u AS (
        UPDATE forge.cron_ticks t
           SET state = f.state, finished_at = clock_timestamp(), error = f.error,
               started_at = f.started, duration_ms = f.took
          FROM f
         WHERE t.namespace = p_namespace AND t.cron = f.cron AND t.scheduled_at = f.at
           AND t.tenure = p_tenure AND t.state = 'running'
        RETURNING f.k
    )
    SELECT coalesce(array_agg(u.k), '{}') INTO v_done FROM u;
    IF cardinality(v_done) < cardinality(p_crons) THEN
        -- Completed in the handler's transaction (tick_complete) by this tenure: final
        -- already, its duration known only now.
        UPDATE forge.cron_ticks t
           SET duration_ms = f.took, started_at = coalesce(t.started_at, f.started)
          FROM unnest(p_crons, p_ticks, p_started, p_took_ms) WITH ORDINALITY
               AS f(cron, at, started, took, k)
         WHERE NOT f.k = ANY (v_done)
           AND t.namespace = p_namespace AND t.cron = f.cron AND t.scheduled_at = f.at
           AND t.tenure = p_tenure AND t.state <> 'running' AND t.duration_ms IS NULL;
    END IF;
    -- In a statement of its own, so that it sees the rows as they are now.
    RETURN QUERY
    SELECT x.k::integer,
           CASE WHEN x.k = ANY (v_done) THEN 'recorded'
                WHEN t.cron IS NULL THEN 'missing'
                WHEN t.tenure <> p_tenure THEN 'taken'
                ELSE t.state END
      FROM unnest(p_crons, p_ticks) WITH ORDINALITY AS x(cron, at, k)
      LEFT JOIN forge.cron_ticks t
        ON t.namespace = p_namespace AND t.cron = x.cron AND t.scheduled_at = x.at;
END;
$$;
