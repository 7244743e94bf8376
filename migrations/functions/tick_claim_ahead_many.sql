-- Claims several ticks of one tenure in one transaction - the ticks due at one instant: one
-- fence check, one insert, one commit for all - each up to p_ahead_ms before its instant by
-- the database's clock, with tick_claim's outcomes: rows (idx, outcome, early_ms), idx the
-- 1-based position in the input; 'early' for a tick further ahead than p_ahead_ms (early_ms:
-- how long until it may be claimed), 'fenced' for every tick when the tenure is not the
-- role's current leadership. A tick claimed ahead is started only after forge.tick_gate (see
-- there for why that keeps each tick exactly once).
CREATE OR REPLACE FUNCTION forge.tick_claim_ahead_many(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_crons     text[],
    p_ticks     timestamptz[],
    p_states    text[],
    p_notes     text[],
    p_ahead_ms  double precision
) RETURNS TABLE (idx integer, outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_horizon timestamptz;
    v_crons   text[];
    v_ticks   timestamptz[];
BEGIN
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        RETURN QUERY SELECT x.k::integer, 'fenced'::text, NULL::double precision
          FROM unnest(p_crons) WITH ORDINALITY AS x(cron, k);
        RETURN;
    END IF;
    v_horizon := clock_timestamp() + make_interval(secs => greatest(p_ahead_ms, 0) / 1000.0);
    -- The fence holds (FOR KEY SHARE on the role's row until the commit): one insert of the
    -- ticks within the horizon, then, in a statement of its own (so that it sees a conflicting
    -- claim that committed meanwhile, such as this tenure's own whose reply was lost), the
    -- outcome of each tick.
    WITH ins AS (
        INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure,
                                      node_id, state, finished_at, error)
        SELECT p_namespace, x.cron, x.at, p_role, p_epoch, p_tenure, p_node, x.state,
               CASE WHEN x.state = 'running' THEN NULL ELSE clock_timestamp() END, x.note
          FROM unnest(p_crons, p_ticks, p_states, p_notes) AS x(cron, at, state, note)
         WHERE x.at <= v_horizon
        ON CONFLICT DO NOTHING
        RETURNING cron_ticks.cron, cron_ticks.scheduled_at
    )
    SELECT coalesce(array_agg(ins.cron), '{}'), coalesce(array_agg(ins.scheduled_at), '{}')
      INTO v_crons, v_ticks FROM ins;
    RETURN QUERY
    SELECT x.k::integer,
           CASE WHEN x.at > v_horizon THEN 'early'
                WHEN EXISTS (SELECT 1 FROM unnest(v_crons, v_ticks) AS n(cron, at)
                              WHERE n.cron = x.cron AND n.at = x.at) THEN 'claimed'
                WHEN t.tenure = p_tenure AND t.state = x.state THEN 'ours'
                ELSE 'taken' END,
           CASE WHEN x.at > v_horizon
                THEN extract(epoch FROM x.at - v_horizon)::double precision * 1000 END
      FROM unnest(p_crons, p_ticks, p_states) WITH ORDINALITY AS x(cron, at, state, k)
      LEFT JOIN forge.cron_ticks t
        ON t.namespace = p_namespace AND t.cron = x.cron AND t.scheduled_at = x.at;
END;
$$;
