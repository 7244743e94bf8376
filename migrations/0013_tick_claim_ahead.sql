-- FORGE crons: ticks claimed shortly before their instant, so that the claim's durable commit
-- is not on the firing path ([cron] claim_ahead; ARCHITECTURE.md, "Claiming ahead").
--
-- The rule that keeps this exactly-once. A leader starts the handler of a tick only after
-- forge.tick_gate, run on the role's lock session, has answered with a database time at or
-- after the tick's instant. The gate answers only while that session is the current,
-- unreleased tenure's; a newer tenure's acquired_at is read from the clock after its lock was
-- granted, which is after the older tenure's lock session ended or unlocked, so after every
-- gate the older tenure passed. Hence: a tick claimed by an older tenure whose instant is at or
-- after the current tenure's acquired_at was never started. The new leader deletes those
-- claims (forge.tick_unclaim_unstarted) and claims the ticks again as its own; a leader that
-- hands over deletes its own claims of ticks it will not start (forge.tick_unclaim). Every
-- other tick an older tenure left running may have started, and follows the cron's
-- `interrupted` policy as before. Manual ticks are claimed after their instant, never ahead.

-- tick_claim_many (0005) for ticks up to p_ahead_ms before their instant by the database's
-- clock. Rows: (idx, outcome, early_ms) as tick_claim_many; 'early' for a tick further ahead
-- than that (early_ms: how long until it may be claimed), 'fenced' for every tick when the
-- tenure is not the role's current leadership.
CREATE FUNCTION forge.tick_claim_ahead_many(
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

-- The gate before a claimed tick's handler starts: the database's time, if the calling session
-- is the lock session of the role's current, unreleased, unexpired tenure; NULL otherwise. A
-- read: no lock, no commit to wait for. The caller starts the handlers of the ticks whose
-- instant is at or before the answer.
CREATE FUNCTION forge.tick_gate(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS timestamptz
LANGUAGE sql
AS $$
    SELECT clock_timestamp() FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.tenure = p_tenure AND l.released_at IS NULL
       AND l.lease_until > clock_timestamp() AND l.backend_pid = pg_backend_pid();
$$;

-- A leader that will not start a tick it claimed ahead (it hands over before the instant)
-- deletes its claim, fenced, so that the tick is not taken for a run cut short. Returns whether
-- a claim was deleted.
CREATE FUNCTION forge.tick_unclaim(
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

-- At the start of a tenure: deletes the claims of older tenures of the role that were never
-- started - still running, not manual, instant at or after this tenure's acquired_at (see the
-- rule above) - so that this tenure claims and runs them on time. Fenced. Returns the deleted
-- ticks.
CREATE FUNCTION forge.tick_unclaim_unstarted(
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
