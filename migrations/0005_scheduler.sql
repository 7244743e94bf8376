-- FORGE crons and jobs on the cluster model of 0004: ticks and role jobs carry their tenure
-- (fenced by forge.fence), handlers can complete a tick or a job inside their own transaction,
-- job rescue reads membership instead of guessing from database sessions, crons can be paused,
-- and the built-in roles prune the ledger and finished jobs and sample the queues.

------------------------------------------------------------------------------------------------
-- Cron ticks
------------------------------------------------------------------------------------------------

ALTER TABLE forge.cron_ticks ADD COLUMN tenure bigint NOT NULL DEFAULT 0;
ALTER TABLE forge.cron_ticks ALTER COLUMN tenure DROP DEFAULT;

COMMENT ON TABLE forge.cron_ticks IS
    'The tick ledger: one row per claimed tick. A row still running under another tenure than the current leader''s = a run cut short by its leader''s death. A handler that completes its tick in its own transaction (CronContext::complete) commits its effects and the succeeded state together.';

-- Claims a tick for a tenure, with a note recorded as the row's error (why a tick recorded as
-- skipped was skipped: 'paused', or the previous run still going). Returns
--   'claimed'  inserted now: run it;
--   'ours'     this tenure had claimed it already (the reply to that claim was lost): run it;
--   'taken'    claimed by another tenure, or already recorded with another state;
--   'early'    not due yet by the database's clock (this node's clock runs ahead): retry in
--              early_ms;
--   'fenced'   the tenure is not the role's current leadership.
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

-- Claims several ticks of one tenure in one transaction - the ticks due at one instant: one
-- fence check, one insert, one commit for all - with tick_claim's outcomes. Rows: (idx,
-- outcome, early_ms), idx the 1-based position in the input. When the fence does not hold or
-- a tick is not due yet, each tick goes through tick_claim (which says which).
CREATE FUNCTION forge.tick_claim_many(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_crons     text[],
    p_ticks     timestamptz[],
    p_states    text[],
    p_notes     text[]
) RETURNS TABLE (idx integer, outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_crons text[];
    v_ticks timestamptz[];
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_ticks) AS t(at) WHERE t.at > clock_timestamp())
       OR NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        FOR k IN 1..coalesce(cardinality(p_crons), 0) LOOP
            RETURN QUERY SELECT k, c.outcome, c.early_ms
              FROM forge.tick_claim(p_namespace, p_role, p_epoch, p_tenure, p_node,
                                    p_crons[k], p_ticks[k], p_states[k], p_notes[k]) c;
        END LOOP;
        RETURN;
    END IF;
    -- The fence holds (FOR KEY SHARE on the role's row until the commit) and every tick is
    -- due: one insert. Then, in a statement of its own (so that it sees a conflicting claim
    -- that committed meanwhile, such as this tenure's own whose reply was lost), the outcome
    -- of each tick the insert did not take.
    WITH ins AS (
        INSERT INTO forge.cron_ticks (namespace, cron, scheduled_at, role, epoch, tenure,
                                      node_id, state, finished_at, error)
        SELECT p_namespace, x.cron, x.at, p_role, p_epoch, p_tenure, p_node, x.state,
               CASE WHEN x.state = 'running' THEN NULL ELSE clock_timestamp() END, x.note
          FROM unnest(p_crons, p_ticks, p_states, p_notes) AS x(cron, at, state, note)
        ON CONFLICT DO NOTHING
        RETURNING cron_ticks.cron, cron_ticks.scheduled_at
    )
    SELECT coalesce(array_agg(ins.cron), '{}'), coalesce(array_agg(ins.scheduled_at), '{}')
      INTO v_crons, v_ticks FROM ins;
    RETURN QUERY
    SELECT x.k::integer,
           CASE WHEN EXISTS (SELECT 1 FROM unnest(v_crons, v_ticks) AS n(cron, at)
                              WHERE n.cron = x.cron AND n.at = x.at) THEN 'claimed'
                WHEN t.tenure = p_tenure AND t.state = x.state THEN 'ours'
                ELSE 'taken' END,
           NULL::double precision
      FROM unnest(p_crons, p_ticks, p_states) WITH ORDINALITY AS x(cron, at, state, k)
      LEFT JOIN forge.cron_ticks t
        ON t.namespace = p_namespace AND t.cron = x.cron AND t.scheduled_at = x.at;
END;
$$;

-- Records the outcome of a run, if the tick is still running under this tenure. Returns
-- 'recorded', or the tick's state when it was already final (for example 'succeeded' after
-- the handler completed it in its own transaction), or 'taken' when another tenure owns it.
CREATE FUNCTION forge.tick_finish(
    p_namespace text,
    p_cron      text,
    p_tick      timestamptz,
    p_tenure    bigint,
    p_state     text,
    p_error     text
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenure bigint;
    v_state  text;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    UPDATE forge.cron_ticks t
       SET state = p_state, finished_at = clock_timestamp(), error = p_error
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
       AND t.tenure = p_tenure AND t.state = 'running';
    IF FOUND THEN
        RETURN 'recorded';
    END IF;
    SELECT t.tenure, t.state INTO v_tenure, v_state FROM forge.cron_ticks t
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick;
    RETURN CASE WHEN NOT FOUND THEN 'missing'
                WHEN v_tenure <> p_tenure THEN 'taken'
                ELSE v_state END;
END;
$$;

-- Transaction-local marks: what tick_complete and jobs_complete recorded in the current
-- transaction, kept in a setting local to it (a rollback, also to a savepoint, drops them).
CREATE FUNCTION forge.tx_mark(p_mark text) RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('forge.completed',
                      coalesce(current_setting('forge.completed', true), '') || '|' || p_mark || '|',
                      true);
$$;

CREATE FUNCTION forge.tx_marked(p_mark text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT position('|' || p_mark || '|' IN coalesce(current_setting('forge.completed', true), '')) > 0;
$$;

-- Completes a tick inside the handler's own transaction: fenced, and marks the tick
-- succeeded, so the handler's writes and the tick's outcome commit together (or not at all).
-- Raises FG001 when the tenure is no longer current and FG002 when the tick is not running
-- under this tenure.
CREATE FUNCTION forge.tick_complete(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_cron      text,
    p_tick      timestamptz
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
       SET state = 'succeeded', finished_at = clock_timestamp(), error = NULL
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

-- Takes over a tick an earlier tenure left running (rerun: attempt + 1) or marks it abandoned,
-- fenced. Returns the tick's attempt number when this tenure took it.
CREATE FUNCTION forge.tick_reclaim(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz,
    p_rerun     boolean
) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_attempt integer;
BEGIN
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        RETURN NULL;
    END IF;
    UPDATE forge.cron_ticks t
       SET attempt = t.attempt + CASE WHEN p_rerun THEN 1 ELSE 0 END,
           epoch = p_epoch, tenure = p_tenure, node_id = p_node,
           state = CASE WHEN p_rerun THEN 'running' ELSE 'abandoned' END,
           claimed_at = clock_timestamp(),
           finished_at = CASE WHEN p_rerun THEN NULL ELSE clock_timestamp() END,
           error = CASE WHEN p_rerun THEN NULL
                        ELSE 'interrupted by the loss of the leadership of epoch ' || t.epoch END
     WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
       AND t.state = 'running' AND t.tenure <> p_tenure
    RETURNING t.attempt INTO v_attempt;
    RETURN v_attempt;
END;
$$;

------------------------------------------------------------------------------------------------
-- Jobs
------------------------------------------------------------------------------------------------

-- tenure: the leadership a role job's attempt runs under. started_at: when the running attempt
-- started; NULL while a job claimed ahead waits for a free slot on its node (such an attempt
-- never counts when it is rescued).
ALTER TABLE forge.jobs
    ADD COLUMN tenure     bigint,
    ADD COLUMN started_at timestamptz;

-- Gives running jobs back: retried at once (available), or dead when out of attempts, or
-- cancelled when a cancel was requested. Guarded by (id, attempt, state = running), so a job
-- that finished or was re-claimed meanwhile is left alone. An attempt that started counts; one
-- that never started (claimed ahead, waiting for a slot) does not: max_attempts grows by one.
DROP FUNCTION forge.jobs_rescue(bigint[], integer[], text[], integer);
CREATE FUNCTION forge.jobs_rescue(
    p_ids                  bigint[],
    p_attempts             integer[],
    p_reasons              text[],
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, queue text, kind text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_queues text[];
    v_kinds  text[];
    v_states text[];
    v_wake   text[];
BEGIN
    WITH r AS (
        UPDATE forge.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                            WHEN j.started_at IS NOT NULL
                             AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts) THEN 'dead'
                            ELSE 'available' END,
               max_attempts = CASE WHEN j.started_at IS NULL
                                   THEN coalesce(j.max_attempts, p_default_max_attempts) + 1
                                   ELSE j.max_attempts END,
               finished_at = CASE WHEN j.cancel_requested
                                    OR (j.started_at IS NOT NULL
                                        AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts))
                                  THEN clock_timestamp() END,
               run_at = CASE WHEN j.cancel_requested
                               OR (j.started_at IS NOT NULL
                                   AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts))
                             THEN j.run_at ELSE clock_timestamp() END,
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'node', j.node_id,
                   'reason', 'rescued',
                   'error', l.reason || CASE WHEN j.started_at IS NULL
                                             THEN ' (the attempt had not started; it does not count)'
                                             ELSE '' END))
          FROM unnest(p_ids, p_attempts, p_reasons) AS l(id, attempt, reason)
         WHERE j.id = l.id AND j.attempt = l.attempt AND j.state = 'running'
        RETURNING j.id, j.queue, j.kind, j.state, j.role, j.namespace
    )
    SELECT array_agg(r.id), array_agg(r.queue), array_agg(r.kind), array_agg(r.state),
           array_agg(DISTINCT r.namespace || ' ' || CASE WHEN r.role IS NULL THEN r.queue ELSE '@' || r.role END)
               FILTER (WHERE r.state = 'available')
      INTO v_ids, v_queues, v_kinds, v_states, v_wake
      FROM r;
    PERFORM pg_notify('forge_jobs', w) FROM unnest(v_wake) AS w;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_queues, v_kinds, v_states);
END;
$$;

-- One round trip of a worker: mark claimed-ahead jobs that started, record the outcomes of
-- finished attempts, then claim up to p_limit jobs, the first p_start of which start at once.
-- Returns the recorded outcomes (claimed = false, with the state written) and the claimed jobs
-- (claimed = true; state 'running', or 'ahead' for the ones claimed ahead, not started yet).
--
-- Outcomes: completed, retryable (after p_delays_ms), available (retry now), dead, cancelled,
-- released (interrupted by a graceful shutdown or a lost leadership: available again, or
-- cancelled if a cancel was requested; attempt numbers never go back, so the interrupted
-- attempt is not counted by raising max_attempts by one). Each is applied only if the job is
-- still running this attempt on this node, so a node that was presumed dead and rescued cannot
-- complete the job a second time. A 'completed' outcome of a job its handler already completed
-- in its own transaction is reported as recorded.
--
-- A role worker (p_role set, p_queue NULL) claims its role's jobs of every queue; its claims
-- are fenced: a deposed leader claims nothing (its outcomes are still recorded, guarded as
-- above).
DROP FUNCTION forge.jobs_step(text, text, text, text, bigint, text[], integer, bigint[],
                              integer[], text[], bigint[], jsonb[], integer);
CREATE FUNCTION forge.jobs_step(
    p_namespace text,
    p_node      text,
    p_queue     text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_kinds     text[],
    p_limit     integer,
    p_start     integer,
    p_started   bigint[],
    p_ids       bigint[],
    p_attempts  integer[],
    p_states    text[],
    p_delays_ms bigint[],
    p_errors    jsonb[],
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, claimed boolean, kind text, args jsonb, attempt integer,
                 max_attempts integer, timeout_ms bigint, pickup_ms double precision, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids    bigint[];
    v_states text[];
    v_due    timestamptz;
    v_wake   text[];
BEGIN
    IF cardinality(p_started) > 0 THEN
        -- (Primary-key lookups, as for the outcomes below.)
        UPDATE forge.jobs j SET started_at = clock_timestamp()
          FROM (SELECT s.id, 'running'::text AS running FROM unnest(p_started) AS s(id)) s
         WHERE j.id = s.id AND j.node_id = p_node AND j.state = s.running
           AND j.started_at IS NULL;
    END IF;

    IF cardinality(p_ids) > 0 THEN
        -- o.running ('running') is compared as a column, not a constant, so the planner cannot
        -- use the partial index jobs_running (a scan of all this node's running entries, many
        -- of them dead under load): each outcome is one primary-key lookup.
        WITH o AS (
            SELECT o.*, 'running'::text AS running
              FROM unnest(p_ids, p_attempts, p_states, p_delays_ms, p_errors)
                   AS o(id, attempt, state, delay_ms, error)
        ), u AS (
            UPDATE forge.jobs j
               SET state = CASE
                       WHEN o.state IN ('retryable', 'available', 'released') AND j.cancel_requested
                           THEN 'cancelled'
                       WHEN o.state = 'released' THEN 'available'
                       ELSE o.state END,
                   max_attempts = CASE WHEN o.state = 'released'
                       THEN coalesce(j.max_attempts, p_default_max_attempts) + 1
                       ELSE j.max_attempts END,
                   run_at = CASE
                       WHEN o.state = 'retryable'
                           THEN clock_timestamp() + coalesce(o.delay_ms, 0) * interval '1 millisecond'
                       WHEN o.state IN ('available', 'released') THEN clock_timestamp()
                       ELSE j.run_at END,
                   finished_at = CASE
                       WHEN o.state IN ('completed', 'dead', 'cancelled')
                         OR (o.state IN ('retryable', 'available', 'released') AND j.cancel_requested)
                       THEN clock_timestamp() END,
                   errors = CASE WHEN o.error IS NULL THEN j.errors
                       ELSE j.errors || jsonb_build_array(jsonb_build_object(
                           'at', clock_timestamp(), 'attempt', j.attempt, 'node', p_node) || o.error)
                       END
              FROM o
             WHERE j.id = o.id AND j.attempt = o.attempt AND j.node_id = p_node
               AND j.state = o.running
            RETURNING j.id, j.state, j.run_at, j.queue, j.role
        ), done AS (
            -- Completed in the handler's own transaction: nothing to write. (Only the outcomes
            -- the update above did not apply are looked up.)
            SELECT j.id, j.state FROM o JOIN forge.jobs j ON j.id = o.id
             WHERE o.state = 'completed' AND NOT EXISTS (SELECT 1 FROM u WHERE u.id = o.id)
               AND j.state = 'completed' AND j.attempt = o.attempt AND j.node_id = p_node
        )
        SELECT array_agg(x.id), array_agg(x.state),
               min(x.run_at) FILTER (WHERE x.state = 'retryable'),
               array_agg(DISTINCT CASE WHEN x.role IS NULL THEN x.queue ELSE '@' || x.role END)
                   FILTER (WHERE x.state = 'available')
          INTO v_ids, v_states, v_due, v_wake
          FROM (SELECT u.id, u.state, u.run_at, u.queue, u.role FROM u
                UNION ALL
                SELECT done.id, done.state, NULL, NULL, NULL FROM done) x;
        IF v_due IS NOT NULL THEN
            PERFORM pg_notify('forge_jobs_due',
                              p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
        END IF;
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
        RETURN QUERY SELECT d.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::bigint, NULL::double precision, d.state
                       FROM unnest(v_ids, v_states) AS d(id, state);
    END IF;

    IF p_limit <= 0 OR (p_role IS NOT NULL
                        AND NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure))
       OR (p_queue IS NOT NULL AND EXISTS (SELECT 1 FROM forge.queues q
                                            WHERE q.namespace = p_namespace AND q.queue = p_queue)) THEN
        -- Nothing to claim, deposed, or the queue is paused.
        RETURN;
    END IF;
    -- Two branches, so that each matches its partial index (jobs_claim, jobs_claim_role) in
    -- plpgsql's cached generic plan.
    IF p_role IS NULL THEN
        RETURN QUERY
        WITH c AS (
            SELECT j.id, j.priority, j.run_at FROM forge.jobs j
             WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.state = 'available'
               AND j.role IS NULL AND j.kind = ANY (p_kinds)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        ), n AS (
            SELECT c.id, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS rn FROM c
        )
        UPDATE forge.jobs j
           SET state = 'running', attempt = j.attempt + 1, node_id = p_node, epoch = NULL,
               tenure = NULL, attempted_at = clock_timestamp(),
               started_at = CASE WHEN n.rn <= p_start THEN clock_timestamp() END
          FROM n
         WHERE j.id = n.id
        RETURNING j.id, true, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
                  extract(epoch FROM j.attempted_at - j.run_at)::double precision * 1000,
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END;
    ELSE
        RETURN QUERY
        WITH c AS (
            SELECT j.id, j.priority, j.run_at FROM forge.jobs j
             WHERE j.namespace = p_namespace AND j.role = p_role
               AND (p_queue IS NULL OR j.queue = p_queue)
               AND NOT EXISTS (SELECT 1 FROM forge.queues q
                                WHERE q.namespace = p_namespace AND q.queue = j.queue)
               AND j.state = 'available' AND j.kind = ANY (p_kinds)
             ORDER BY j.priority, j.run_at, j.id
             LIMIT p_limit
               FOR UPDATE SKIP LOCKED
        ), n AS (
            SELECT c.id, row_number() OVER (ORDER BY c.priority, c.run_at, c.id) AS rn FROM c
        )
        UPDATE forge.jobs j
           SET state = 'running', attempt = j.attempt + 1, node_id = p_node, epoch = p_epoch,
               tenure = p_tenure, attempted_at = clock_timestamp(),
               started_at = CASE WHEN n.rn <= p_start THEN clock_timestamp() END
          FROM n
         WHERE j.id = n.id
        RETURNING j.id, true, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
                  extract(epoch FROM j.attempted_at - j.run_at)::double precision * 1000,
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END;
    END IF;
END;
$$;

-- A worker's check of its own running jobs, after a failed round trip or a LISTEN outage:
-- jobs running on this node for this worker that the worker does not know (a claim whose
-- response was lost, an ended role tenure) are rescued; for the jobs it knows, it learns
-- which were cancelled ('cancel') or taken away from it ('gone'). Role workers (p_queue NULL:
-- all queues of the role) also rescue jobs of their role left running under another tenure,
-- on any node.
DROP FUNCTION forge.jobs_reconcile(text, text, text, text, bigint, bigint[], integer[], integer);
CREATE FUNCTION forge.jobs_reconcile(
    p_namespace            text,
    p_node                 text,
    p_queue                text,
    p_role                 text,
    p_tenure               bigint,
    p_ids                  bigint[],
    p_attempts             integer[],
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
BEGIN
    SELECT array_agg(j.id), array_agg(j.attempt),
           array_agg(CASE WHEN j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure
                          THEN 'orphaned: claimed by node ' || p_node || ' but not running there'
                          ELSE 'the leadership of role ' || j.role || ' at epoch ' || j.epoch || ' ended' END)
      INTO v_ids, v_attempts, v_reasons
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.state = 'running'
       AND (p_queue IS NULL OR j.queue = p_queue) AND j.role IS NOT DISTINCT FROM p_role
       AND ((j.node_id = p_node AND NOT (j.id = ANY (p_ids)))
            OR (p_role IS NOT NULL AND j.tenure IS DISTINCT FROM p_tenure));
    IF v_ids IS NOT NULL THEN
        PERFORM forge.jobs_rescue(v_ids, v_attempts, v_reasons, p_default_max_attempts);
    END IF;

    RETURN QUERY
    SELECT k.id, CASE WHEN j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node
                           OR j.attempt <> k.attempt THEN 'gone'
                      ELSE 'cancel' END
      FROM unnest(p_ids, p_attempts) AS k(id, attempt)
      LEFT JOIN forge.jobs j ON j.id = k.id
     WHERE j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node OR j.attempt <> k.attempt
        OR j.cancel_requested;
END;
$$;

-- Completes a job inside its handler's own transaction (River's JobCompleteTx): the handler's
-- writes and the job's completion commit together, or not at all. Guarded like every outcome
-- (this attempt, this node, still running); a role job is also fenced by its tenure. Raises
-- FG001 when fenced and FG002 when the job is no longer running this attempt on this node.
CREATE FUNCTION forge.jobs_complete(
    p_id        bigint,
    p_attempt   integer,
    p_node      text,
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
    v_node  text;
    v_attempt integer;
    v_mark  text;
BEGIN
    IF p_role IS NOT NULL THEN
        PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);
    v_mark := format('job %s %s', p_id, p_attempt);
    UPDATE forge.jobs j
       SET state = 'completed', finished_at = clock_timestamp()
     WHERE j.id = p_id AND j.attempt = p_attempt AND j.node_id = p_node AND j.state = 'running';
    IF FOUND THEN
        PERFORM forge.tx_mark(v_mark);
        RETURN;
    END IF;
    SELECT j.state, j.node_id, j.attempt INTO v_state, v_node, v_attempt
      FROM forge.jobs j WHERE j.id = p_id;
    -- Completed already counts only when this transaction completed it (see tick_complete).
    IF v_state = 'completed' AND v_node = p_node AND v_attempt = p_attempt
       AND forge.tx_marked(v_mark) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'FG002',
        MESSAGE = format('job %s is no longer running attempt %s on node %s', p_id, p_attempt, p_node),
        DETAIL = CASE WHEN v_state IS NULL THEN 'the job no longer exists'
                      ELSE format('it is %s (attempt %s, node %s)', v_state, v_attempt, v_node) END;
END;
$$;

-- The scheduler leader's pass, fenced by its tenure: rescue the running jobs of nodes that
-- are down or stopped (membership says so, with evidence; see 0004) and of role leaderships
-- that ended, and promote due jobs. (Finished jobs are pruned by the log compactor, queue
-- figures sampled by the metrics aggregator.) Rows:
--   ('rescued', queue, kind, new state, n)   jobs taken back
--   ('next_due', NULL, NULL, NULL, ms, at)   how long until the next scheduled job is due, and
--                                            the server's clock
DROP FUNCTION forge.jobs_maintain(text, bigint, bigint, integer, bigint, bigint, integer);
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

-- Registration moved to membership (forge.node_join). What remains for jobs at a node's start:
-- rescue what the node's previous run left running. The node holds its id's lock (0004), so no
-- other live process can be running these.
DROP FUNCTION forge.jobs_node_start(text, text, jsonb, integer);
CREATE FUNCTION forge.jobs_rescue_own(
    p_namespace            text,
    p_node                 text,
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, queue text, kind text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
BEGIN
    SELECT array_agg(j.id), array_agg(j.attempt) INTO v_ids, v_attempts
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.node_id = p_node AND j.state = 'running';
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM forge.jobs_rescue(
            v_ids, v_attempts,
            array_fill('node ' || p_node || ' restarted during the attempt', ARRAY[cardinality(v_ids)]),
            p_default_max_attempts);
    END IF;
END;
$$;

------------------------------------------------------------------------------------------------
-- Pausing crons, the log compactor's pruners for the tick ledger and finished jobs, and the
-- queue figures the metrics_aggregator leader samples
------------------------------------------------------------------------------------------------

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

-- Operators' actions (the admin API and the CLI). Each records itself in the audit trail
-- (forge.audit) in its own transaction.

-- "Trigger now": a pending request on the cron, which whichever node leads its role runs once
-- as a manual tick (cron_ticks.manual) at the requested instant; the claim clears the request.
ALTER TABLE forge.crons
    ADD COLUMN trigger_requested_at timestamptz,
    ADD COLUMN trigger_requested_by text;
ALTER TABLE forge.cron_ticks ADD COLUMN manual boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN forge.cron_ticks.manual IS
    'A run asked for by an operator ("trigger now"), not a tick of the schedule: it does not move the catch-up frontier.';

-- Returns the instant of the pending manual tick (an earlier request still pending is kept),
-- NULL when no such cron is known.
CREATE FUNCTION forge.cron_trigger(p_namespace text, p_cron text, p_by text) RETURNS timestamptz
LANGUAGE plpgsql
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    UPDATE forge.crons c
       SET trigger_requested_at = coalesce(c.trigger_requested_at,
                                           date_trunc('milliseconds', clock_timestamp())),
           trigger_requested_by = coalesce(c.trigger_requested_by, p_by)
     WHERE c.namespace = p_namespace AND c.name = p_cron
    RETURNING c.trigger_requested_at INTO v_at;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM forge.audit(p_namespace, 'trigger_cron', p_cron, p_by,
                        jsonb_build_object('scheduled_at', v_at));
    PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_cron);
    RETURN v_at;
END;
$$;

-- Claims a manual tick (see tick_claim) and clears the request it answers, whatever the
-- claim's outcome: a request is answered once.
CREATE FUNCTION forge.tick_claim_manual(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_node      text,
    p_cron      text,
    p_tick      timestamptz
) RETURNS TABLE (outcome text, early_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_outcome text;
    v_early   double precision;
BEGIN
    SELECT c.outcome, c.early_ms INTO v_outcome, v_early
      FROM forge.tick_claim(p_namespace, p_role, p_epoch, p_tenure, p_node, p_cron, p_tick,
                            'running', NULL) c;
    IF v_outcome IN ('claimed', 'ours', 'taken') THEN
        UPDATE forge.cron_ticks t SET manual = true
         WHERE t.namespace = p_namespace AND t.cron = p_cron AND t.scheduled_at = p_tick
           AND v_outcome = 'claimed';
        UPDATE forge.crons c SET trigger_requested_at = NULL, trigger_requested_by = NULL
         WHERE c.namespace = p_namespace AND c.name = p_cron AND c.trigger_requested_at = p_tick;
        PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_cron);
    END IF;
    RETURN QUERY SELECT v_outcome, v_early;
END;
$$;

-- Paused queues: no node claims their jobs until resumed.
CREATE TABLE forge.queues (
    namespace text        NOT NULL,
    queue     text        NOT NULL,
    paused_at timestamptz,
    paused_by text,
    PRIMARY KEY (namespace, queue)
);

CREATE FUNCTION forge.queue_set_paused(p_namespace text, p_queue text, p_paused boolean, p_by text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_paused THEN
        INSERT INTO forge.queues (namespace, queue, paused_at, paused_by)
        VALUES (p_namespace, p_queue, clock_timestamp(), p_by)
        ON CONFLICT (namespace, queue) DO UPDATE
           SET paused_at = coalesce(forge.queues.paused_at, EXCLUDED.paused_at),
               paused_by = coalesce(forge.queues.paused_by, EXCLUDED.paused_by);
    ELSE
        DELETE FROM forge.queues q WHERE q.namespace = p_namespace AND q.queue = p_queue;
        -- Wake the workers of the queue, and the role workers with jobs waiting in it.
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || p_queue);
        PERFORM pg_notify('forge_jobs', p_namespace || ' @' || r.role)
           FROM (SELECT DISTINCT j.role FROM forge.jobs j
                  WHERE j.namespace = p_namespace AND j.queue = p_queue
                    AND j.state = 'available' AND j.role IS NOT NULL) r;
    END IF;
    PERFORM forge.audit(p_namespace, CASE WHEN p_paused THEN 'pause_queue' ELSE 'resume_queue' END,
                        p_queue, p_by, '{}');
END;
$$;

-- Makes jobs available again now (dead, cancelled, completed, waiting for a retry or
-- scheduled), with room for one more attempt; running jobs are left alone. Returns the ids.
CREATE FUNCTION forge.jobs_retry_now(p_namespace text, p_ids bigint[]) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_ids  bigint[];
    v_wake text[];
BEGIN
    WITH u AS (
        UPDATE forge.jobs j
           SET state = 'available', run_at = clock_timestamp(), finished_at = NULL,
               cancel_requested = false, max_attempts = greatest(j.max_attempts, j.attempt + 1)
         WHERE j.namespace = p_namespace AND j.id = ANY (p_ids)
           AND j.state IN ('dead', 'cancelled', 'completed', 'retryable', 'scheduled')
        RETURNING j.id, j.queue, j.role
    )
    SELECT array_agg(u.id),
           array_agg(DISTINCT CASE WHEN u.role IS NULL THEN u.queue ELSE '@' || u.role END)
      INTO v_ids, v_wake FROM u;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    RETURN QUERY SELECT unnest(coalesce(v_ids, '{}'));
END;
$$;
