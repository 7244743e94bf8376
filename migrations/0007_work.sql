-- FORGE crons and jobs, part 2: pausing crons, the log compactor's pruners for the tick ledger
-- and finished jobs (moved out of the scheduler's pass: one owner per table), and the queue
-- figures the metrics_aggregator leader samples.

ALTER TABLE forge.crons
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN paused_by text;

COMMENT ON COLUMN forge.crons.paused_at IS
    'Set while the cron is paused: whichever node leads its role records its ticks as skipped (error ''paused'') instead of running them.';

-- Pauses or resumes a cron; tells the leaders at once (channel forge_crons, payload
-- '<namespace> <cron>'). Returns false when no such cron is known.
CREATE FUNCTION forge.cron_set_paused(
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

-- Prunes finished ticks older than the retention, keeping the newest tick of every cron (a new
-- leader resumes after it).
CREATE FUNCTION forge.prune_ticks(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.cron_ticks t
         WHERE (t.namespace, t.cron, t.scheduled_at) IN (
               SELECT x.namespace, x.cron, x.scheduled_at FROM forge.cron_ticks x
                WHERE x.namespace = p_namespace AND x.finished_at IS NOT NULL
                  AND x.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                  AND x.scheduled_at < (SELECT max(m.scheduled_at) FROM forge.cron_ticks m
                                         WHERE m.namespace = x.namespace AND m.cron = x.cron)
                LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;

-- Prunes completed and cancelled jobs older than the retention.
CREATE FUNCTION forge.prune_finished_jobs(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state IN ('completed', 'cancelled')
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;

-- Prunes dead-lettered jobs older than the retention.
CREATE FUNCTION forge.prune_dead_jobs(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state = 'dead'
                           AND f.finished_at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;

-- The scheduler leader's pass, now only rescue and promotion (pruning moved to the log
-- compactor, queue figures to the metrics aggregator). Rows:
--   ('rescued', queue, kind, new state, n)   jobs taken back
--   ('next_due', NULL, NULL, NULL, ms, at)   how long until the next scheduled job is due, and
--                                            the server's clock
DROP FUNCTION forge.jobs_maintain(text, text, bigint, bigint, integer, bigint, bigint, integer);
CREATE FUNCTION forge.jobs_maintain(
    p_namespace            text,
    p_role                 text,
    p_epoch                bigint,
    p_tenure               bigint,
    p_default_max_attempts integer,
    p_limit                integer
) RETURNS TABLE (event text, queue text, kind text, state text, n double precision,
                 at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
    v_promote  record;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH lost AS (
        SELECT j.id, j.attempt,
               CASE
                   WHEN j.role IS NOT NULL AND NOT EXISTS (
                           SELECT 1 FROM forge.leaders l
                            WHERE l.namespace = j.namespace AND l.role = j.role
                              AND l.tenure IS NOT DISTINCT FROM j.tenure AND l.released_at IS NULL)
                       THEN 'the leadership of role ' || j.role || ' at epoch '
                            || coalesce(j.epoch::text, '?') || ' ended'
                   WHEN nd.node_id IS NULL
                       THEN 'node ' || j.node_id || ' is not a member of the cluster'
                   WHEN nd.stopped_at IS NOT NULL
                       THEN 'node ' || j.node_id || ' stopped without finishing the attempt'
                   WHEN nd.down_at IS NOT NULL
                       THEN 'node ' || j.node_id || ' is down: ' || coalesce(nd.down_reason, '?')
               END AS reason
          FROM forge.jobs j
          LEFT JOIN forge.nodes nd ON nd.namespace = j.namespace AND nd.node_id = j.node_id
         WHERE j.namespace = p_namespace AND j.state = 'running'
    )
    SELECT array_agg(lost.id), array_agg(lost.attempt), array_agg(lost.reason)
      INTO v_ids, v_attempts, v_reasons
      FROM lost WHERE lost.reason IS NOT NULL;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY
        SELECT 'rescued', r.queue, r.kind, r.state, count(*)::double precision, NULL::timestamptz
          FROM forge.jobs_rescue(v_ids, v_attempts, v_reasons, p_default_max_attempts) r
         GROUP BY r.queue, r.kind, r.state;
    END IF;

    SELECT * INTO v_promote FROM forge.jobs_promote(p_namespace, p_limit);
    RETURN QUERY SELECT 'next_due', NULL::text, NULL::text, NULL::text, v_promote.next_due_in_ms,
                        v_promote.server_now;
END;
$$;

-- Unfinished jobs by queue, kind and state, with the age of the oldest due one, and dead jobs:
-- the metrics aggregator's queue figures.
CREATE FUNCTION forge.jobs_figures(p_namespace text)
RETURNS TABLE (queue text, kind text, state text, n bigint, oldest_age_s double precision)
LANGUAGE sql STABLE
AS $$
    SELECT j.queue, j.kind, j.state, count(*),
           extract(epoch FROM clock_timestamp() - min(j.run_at))::double precision
      FROM forge.jobs j
     WHERE j.namespace = p_namespace
       AND j.state IN ('available', 'scheduled', 'running', 'retryable', 'dead')
     GROUP BY j.queue, j.kind, j.state
$$;

-- Claims a tick (see 0005), now with a note recorded as the row's error: why a tick recorded
-- as skipped was skipped ('paused', or the previous run still going).
DROP FUNCTION forge.tick_claim(text, text, bigint, bigint, text, text, timestamptz, text);
CREATE FUNCTION forge.tick_claim(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz,
    p_state     text,
    p_note      text
) RETURNS TABLE (outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_tenure bigint;
    v_state  text;
BEGIN
    IF p_tick > clock_timestamp() THEN
        RETURN QUERY SELECT 'early'::text,
                            extract(epoch FROM p_tick - clock_timestamp())::double precision * 1000;
        RETURN;
    END IF;
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        RETURN QUERY SELECT 'fenced'::text, NULL::double precision;
        RETURN;
    END IF;
    INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure, node_id,
                                  state, finished_at, error)
    VALUES (p_namespace, p_cron, p_tick, p_role, p_epoch, p_tenure, p_node, p_state,
            CASE WHEN p_state = 'running' THEN NULL ELSE clock_timestamp() END, p_note)
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        RETURN QUERY SELECT 'claimed'::text, NULL::double precision;
        RETURN;
    END IF;
    SELECT t.tenure, t.state INTO v_tenure, v_state FROM forge.cron_ticks t
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick;
    RETURN QUERY SELECT CASE WHEN v_tenure = p_tenure AND v_state = p_state THEN 'ours'
                             ELSE 'taken' END, NULL::double precision;
END;
$$;
