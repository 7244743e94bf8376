-- One round trip of a worker: mark claimed-ahead jobs that started (p_started), record the
-- outcomes of finished attempts, then claim up to p_limit jobs, the first p_start of which
-- start at once. Claims and outcomes commit with synchronous_commit = on, whatever the
-- database's default. Performance-critical: every job passes through here twice.
--
-- Outcomes: completed, retryable (after p_delays_ms), available (retry now), dead, cancelled,
-- released (interrupted by a graceful shutdown or a lost leadership: available again, or
-- cancelled if a cancel was requested; attempt numbers never go back, so the interrupted
-- attempt is not counted by raising max_attempts by one). Each is applied only if the job is
-- still running this attempt on this node, so a node that was presumed dead and rescued cannot
-- complete the job a second time. With p_keep_completed = false ([jobs] completed_retention =
-- "0s") a completed job is deleted under the same guard instead of updated.
--
-- Rows returned:
--   outcomes (claimed = false), only for the outcomes not recorded as asked:
--     state = the state recorded instead (a retry that became 'cancelled' because a cancel was
--             requested meanwhile). An outcome recorded as asked has no row: 'released' is
--             recorded as 'available', the others as their own name; a 'completed' outcome of
--             a job its handler completed in its own transaction counts as recorded, and so
--             does one whose row is gone when completed jobs are deleted (deleted by this
--             attempt's earlier report whose reply was lost, or by its handler's transaction;
--             or - the one case it misreads - by another node's completion after a rescue).
--     state = 'refused' when nothing was recorded: the job is no longer running this attempt
--             on this node (it was rescued while this node seemed gone).
--   claims (claimed = true): state 'running', or 'ahead' for jobs claimed ahead, not started
--   yet (a rescue does not count such an attempt, three times per job: see forge.jobs_rescue);
--   priority and run_at give the worker its floor for the next claim.
--   stale (claimed = false, id NULL): nothing was claimed, because the claim did not carry its
--   lane's current identity (see below); the worker reconciles, which gives it the current one.
--
-- A role worker (p_role set; p_queue NULL: every queue of the role) claims its role's jobs;
-- its claims are fenced: a deposed leader claims nothing (its outcomes are still recorded,
-- guarded as above). A paused queue (forge.queues) is not claimed from.
--
-- A queue's limits (forge.queue_limits: a global concurrency, a rate) bound a queue worker's
-- claims (a role's jobs, claimed by one leader, are not bound by them). Such a claim takes the
-- queue's limit lock (a transaction-level advisory lock, so two nodes' claims take turns and
-- cannot both take the last slot; waiting 250 ms at most, else it claims nothing and answers
-- a 'limited' row of 100 ms, so that a claimant frozen holding the lock does not hold back this
-- round trip's outcomes: see forge.limit_lock; a kind's lock likewise, below), counts in
-- statements that begin after it (each sees every claim that released the lock before) the
-- queue's running attempts claimed under the limit
-- (forge.queue_slots, whose ended attempts are pruned here) and its claims in the rate's window
-- (forge.queue_claims, pruned here), and
-- claims at most what is left, only jobs that start at once (none ahead: a slot held by a job
-- waiting on its node would sit idle, and a rate counts starts). A claim cut short answers a
-- 'limited' row whose pickup_ms says when to claim again: when the window lets the next claim
-- through, or in a second for a global limit (a recorded outcome of the queue wakes its workers
-- sooner). A queue without limits pays one primary-key probe of forge.queue_limits.
--
-- A job kind's limits (forge.kind_limits: the same two) bound a queue worker's claims of the
-- kind, whichever queue its jobs sit in. A worker none of whose kinds has limits pays one index
-- probe of forge.kind_limits. Otherwise the claim first reads, without locks, what of its kinds
-- is out of reach (forge.kind_limits_now: kinds at a limit, rate keys whose window is spent)
-- and passes over their jobs, so that they cannot crowd the head of the queue; it claims the
-- rest as an unlimited claim does (ahead too). Then, if it found jobs of limited kinds, it
-- takes their limit locks (after its queue's, in the order of the kinds' names, so claims of
-- several queues sharing kinds cannot deadlock; a kind whose lock a frozen claimant holds is
-- left out after 250 ms, and the claim looks once more without it, so that its jobs cannot fill
-- the claim and hold back the other kinds'), reads again each one's running attempts
-- claimed under its global limit (forge.kind_slots, over all queues; those of ended attempts
-- pruned here) and its claims in its
-- window (forge.kind_claims, pruned here), and keeps of each kind only its first jobs within its
-- room and its rate key's budget, and of those only as many as start now (a slot held by a job
-- waiting on its node would sit idle; a rate counts starts): a job claimed satisfies every
-- limit of its queue and of its kind. Jobs passed over or cut stay available; the claim then
-- answers a 'paced' row: the worker claims from the head next time, and, if this claim came
-- back short, again after pickup_ms (at once after a cut).

-- A claim carries its worker's identity: its node's incarnation and its lane's generation
-- (forge.job_lanes; the lane is the queue, or '@' || role). It claims only if that is the lane's
-- current identity, checked under the lane lock that the round trip holds shared from its start,
-- and that forge.jobs_lane_take holds exclusively while it advances the generation (the worker's
-- reconciliation, a new incarnation's rescue). So a claim that reaches the server after its
-- worker gave up on it and reconciled, or after its node restarted, takes nothing: it cannot
-- strand jobs on a live node that does not know them. (A primary-key probe of forge.job_lanes.)
--
-- Rows found first, then written by ctid. Each write finds its rows first - the reported ones
-- one by one by primary key (a LATERAL subquery with LIMIT 1 is never flattened into a join),
-- the claimed ones by the claim's SELECT ... FOR UPDATE SKIP LOCKED - and then writes them
-- through `ctid = ANY (...)`, a TID scan, whatever the statistics. Joining the ids back to
-- forge.jobs let the planner choose: with the statistics of a table whose jobs were all queued
-- when it was last analyzed it scanned the whole table for each claim and looped over all
-- reported ids for each running job (55-74 ms for one round trip of 500 jobs, against 4-8 ms).
-- A row found and not yet written cannot change meanwhile where the lookup locks it: the
-- claim's and the mixed outcomes' lookups do (a lookup that waits for another writer checks
-- the guard again on the version it then locks). Completions alone, the common case, skip the
-- lock (a WAL record per job) and write only the versions they found (by ctid and by their
-- creating transaction, which every later version of the row has another of), so a row
-- written by someone else in between is left out of the write, and a second pass finds those
-- again, locked. Marking jobs started does the same: a first pass without a lock, whose update
-- repeats its conditions, and a locked second pass for the rows written in between.
--
-- The refusal checks' EXISTS subqueries end in OFFSET 0, which keeps each a primary-key probe
-- per reported job: without it the planner may turn one into a join or a hashed subplan that
-- reads every row of forge.jobs, which a cached generic plan made while the table was small
-- would go on doing as it grows (until the next ANALYZE replans it).
--
-- The reported rows are a subquery kept apart (OFFSET 0) that names 'running' through a column,
-- so that the planner never matches the lookups to a partial index of running jobs by node
-- (jobs_running, which migration 0016 dropped; kept so, should such an index come back): once
-- ANALYZE had seen few running jobs, a generic plan would scan
-- all this node's jobs_running entries, and while any snapshot older than the finished jobs'
-- entries is open (a long query elsewhere, a count of a big backlog) those cannot be marked
-- dead, so every report walks the entries of every job the node ran since (121-264 buffers for
-- 1-2 rows, measured; a drain beside 10,000,000 finished jobs fell to 9,400-34,500 jobs/s,
-- 32,300-45,700 with primary-key lookups).
DROP FUNCTION IF EXISTS forge.jobs_step(text, text, text, text, bigint, bigint, text[], integer,
    integer, bigint[], bigint[], integer[], text[], bigint[], jsonb[], integer, smallint,
    timestamptz, bigint, boolean);
DROP FUNCTION IF EXISTS forge.jobs_step(text, text, text, text, bigint, bigint, bigint, bigint,
    text[], integer, integer, bigint[], bigint[], integer[], text[], bigint[], jsonb[], integer,
    smallint, timestamptz, bigint, boolean);
CREATE OR REPLACE FUNCTION forge.jobs_step(
    p_namespace text,
    p_node      text,
    p_queue     text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_incarnation bigint,
    p_generation  bigint,
    p_kinds     text[],
    p_limit     integer,
    p_start     integer,
    p_started   bigint[],
    p_ids       bigint[],
    p_attempts  integer[],
    p_states    text[],
    p_delays_ms bigint[],
    p_errors    jsonb[],
    p_default_max_attempts integer,
    p_after_priority smallint,
    p_after_run_at   timestamptz,
    p_after_id       bigint,
    p_keep_completed boolean,
    -- The jobs the worker holds besides this round trip's outcomes (running, claimed ahead,
    -- outcomes not yet recorded or in flight on its other connection): its lane's list after a
    -- claim (see the claim below). NULL (a caller that does not say, such as a node of an
    -- older release): the list keeps those of its jobs still running on this node.
    p_held           bigint[] DEFAULT NULL
) RETURNS TABLE (id bigint, claimed boolean, kind text, args jsonb, attempt integer,
                 max_attempts integer, timeout_ms bigint, pickup_ms double precision, state text,
                 priority smallint, run_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_applied integer;
    v_ids     bigint[];
    v_states  text[];
    v_due     timestamptz;
    v_wake    text[];
    -- Rows written that have dependencies (see forge.jobs_parent_finished): ended, with how,
    -- and deleted.
    v_linked  bigint[];
    v_linked_ends text[];
    v_gone    bigint[];
    v_pass_linked bigint[];
    v_tids    tid[];
    v_written integer;
    v_creators xid[];
    v_start   tid[];
    v_start_all boolean;
    v_lane    text := coalesce(p_queue, '@' || p_role);
    v_limits  forge.queue_limits;
    v_room    integer;
    v_budget  integer;
    v_wait    double precision;
    v_claimed_at timestamptz;
    v_limited boolean := false;
    v_limit_locked boolean;
    v_kinds_limited boolean;
    -- The worker's limited kinds (forge.kind_limits) out of reach before the claim, read
    -- without their limit locks: the kinds at a limit, and '<kind>\x1f<rate key>' of the rate
    -- keys whose window is spent, with each keyed kind's key argument (side by side); and the
    -- kinds a claim may take (p_kinds less the ones at a limit).
    v_full_kinds  text[];
    v_spent       text[];
    v_keyed_kinds text[];
    v_key_args    text[];
    v_open_kinds  text[] := p_kinds;
    v_kl_wait     double precision;
    -- A limited kind's lock was held too long (forge.limit_lock): its jobs were left out.
    v_kl_busy     boolean := false;
    -- The kinds whose lock this round of the claim could not take (see the claim's loop).
    v_busy_kinds  text[];
    -- The limited kinds among the jobs a claim found, side by side, as read under their limit
    -- locks: room left under a global limit (NULL: none), rate count, rate key argument.
    v_kl_kinds text[];
    v_kl_room  integer[];
    v_kl_rate  integer[];
    v_kl_key   text[];
    -- Of those, the kinds with a global limit (their attempts are counted), and the claim's
    -- limited rows (they start now: a slot held by a job waiting on its node would sit idle).
    v_kl_global text[];
    v_kl_tids   tid[];
    v_found     integer;
    v_kind     text;
BEGIN
    -- The worker's lane lock, held shared until this round trip's transaction ends: the
    -- worker's reconciliation waits for it, or ends this session (forge.jobs_reconcile).
    PERFORM pg_advisory_xact_lock_shared(hashtext('forge.jobs_worker'),
        hashtext(p_namespace || ' ' || p_node || ' ' || v_lane));
    -- No sequential scans: every statement below has an index or TID plan that reads only the
    -- rows it needs, but the planner prefers a sequential scan while the statistics say the
    -- table is (nearly) empty - as they do after autovacuum analyzed an idle queue, until it
    -- analyzes again - and then each claim read the whole table (measured: one-job round trips
    -- on a table analyzed empty that grew to 3,000 jobs, 198 buffers and 439 us each, against
    -- 19 buffers and 174 us). Without them the one plan each statement should have is also
    -- the generic one, so the statements are planned once per session instead of at every
    -- call (a one-job round trip 110 us instead of 170). For this round trip's transaction only.
    PERFORM set_config('synchronous_commit', 'on', true), set_config('enable_seqscan', 'off', true),
            set_config('plan_cache_mode', 'force_generic_plan', true);
    -- Whether a kind this worker runs has limits (one index probe; a role's jobs are not bound).
    v_kinds_limited := p_role IS NULL
        AND EXISTS (SELECT 1 FROM forge.kind_limits k
                     WHERE k.namespace = p_namespace AND k.kind = ANY (p_kinds));

    IF cardinality(p_started) > 0 THEN
        -- (Rows found by primary key, then written by ctid: see this file's header.) The first
        -- pass locks nothing; a row written by someone else between its lookup and its update (a
        -- cancel request) is then left out of the update - its new version is not at the TID
        -- found - and only then a second pass finds the rows again, locked, so that no mark is
        -- lost: a job whose node dies after it started must count the attempt.
        FOR v_pass IN 1..2 LOOP
            IF v_pass = 1 THEN
                SELECT array_agg(x.tid) INTO v_tids
                  FROM (SELECT s.id, 'running'::text AS running FROM unnest(p_started) AS s(id)
                        OFFSET 0) s
                 CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs_live j
                                      WHERE j.id = s.id AND j.node_id = p_node AND j.state = s.running
                                        AND j.started_at IS NULL LIMIT 1) x;
            ELSE
                SELECT array_agg(x.tid) INTO v_tids
                  FROM (SELECT s.id, 'running'::text AS running FROM unnest(p_started) AS s(id)
                        OFFSET 0) s
                 CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs_live j
                                      WHERE j.id = s.id AND j.node_id = p_node AND j.state = s.running
                                        AND j.started_at IS NULL LIMIT 1 FOR NO KEY UPDATE) x;
            END IF;
            -- (A version written meanwhile is checked again by these conditions, in a CASE that
            -- the planner never matches to jobs_running: see the header.)
            UPDATE forge.jobs_live j SET started_at = clock_timestamp()
             WHERE j.ctid = ANY (v_tids)
               AND CASE WHEN j.node_id = p_node AND j.state = 'running' AND j.started_at IS NULL
                        THEN true END;
            GET DIAGNOSTICS v_written = ROW_COUNT;
            EXIT WHEN v_written = coalesce(cardinality(v_tids), 0);
        END LOOP;
    END IF;

    IF cardinality(p_ids) > 0 AND p_states <@ ARRAY['completed'] THEN
        -- Only completions (the common case): the guarded rows, then one update or one delete
        -- of them, in at most two passes. The first finds the rows without locking them (a row
        -- lock is a WAL record of its own per job) and writes only the versions it found: a
        -- version's creating transaction (xmin) must be one that created a version found, and
        -- every version written after the lookup has another creator. So a row written by
        -- someone else in between (a cancel request, the handler's own completion, a rescue)
        -- is left out, whether or not PostgreSQL's TID scan checks its TID list again on the
        -- newer version (15.18 does; older sources returned true). Only when some row was
        -- left out does a second pass find the rows again, locked this time, so that it cannot
        -- miss them. (The state and node are checked again in a CASE, which the planner never
        -- matches to jobs_running: see the header.)
        v_applied := 0;
        FOR v_pass IN 1..2 LOOP
            -- (Two spellings of one lookup: plpgsql cannot choose a locking clause at run time
            -- but through EXECUTE, which would plan it at every call.)
            IF v_pass = 1 THEN
                SELECT array_agg(x.tid), array_agg(x.creator),
                       array_agg(o.id) FILTER (WHERE x.linked)
                  INTO v_tids, v_creators, v_pass_linked
                  FROM (SELECT o.id, o.attempt, 'running'::text AS running
                          FROM unnest(p_ids, p_attempts) AS o(id, attempt) OFFSET 0) o
                 CROSS JOIN LATERAL (SELECT j.ctid AS tid, j.xmin AS creator,
                                            NOT p_keep_completed
                                            AND (j.has_children OR j.parents IS NOT NULL) AS linked
                                       FROM forge.jobs_live j
                                      WHERE j.id = o.id AND j.attempt = o.attempt
                                        AND j.node_id = p_node AND j.state = o.running
                                      LIMIT 1) x;
            ELSE
                SELECT array_agg(x.tid), array_agg(x.creator),
                       array_agg(o.id) FILTER (WHERE x.linked)
                  INTO v_tids, v_creators, v_pass_linked
                  FROM (SELECT o.id, o.attempt, 'running'::text AS running
                          FROM unnest(p_ids, p_attempts) AS o(id, attempt) OFFSET 0) o
                 CROSS JOIN LATERAL (SELECT j.ctid AS tid, j.xmin AS creator,
                                            NOT p_keep_completed
                                            AND (j.has_children OR j.parents IS NOT NULL) AS linked
                                       FROM forge.jobs_live j
                                      WHERE j.id = o.id AND j.attempt = o.attempt
                                        AND j.node_id = p_node AND j.state = o.running
                                      LIMIT 1 FOR NO KEY UPDATE) x;
            END IF;
            IF p_keep_completed THEN
                -- (Kept completed jobs move to forge.jobs_done.)
                SELECT count(*), array_agg(m.id) FILTER (WHERE m.has_children)
                  INTO v_written, v_pass_linked
                  FROM forge.jobs_move_done(v_tids, v_creators, p_node) m;
            ELSE
                -- (No RETURNING: it would fetch each deleted row again. The rows with
                -- dependencies were noted by the lookup.)
                DELETE FROM forge.jobs_live j
                 WHERE j.ctid = ANY (v_tids) AND j.xmin = ANY (v_creators)
                   AND CASE WHEN j.state = 'running' AND j.node_id = p_node THEN true END;
                GET DIAGNOSTICS v_written = ROW_COUNT;
            END IF;
            v_linked := v_linked || v_pass_linked;
            v_applied := v_applied + v_written;
            EXIT WHEN v_written = coalesce(cardinality(v_tids), 0);
        END LOOP;
        IF v_linked IS NOT NULL THEN
            IF NOT p_keep_completed THEN
                -- Of the rows with dependencies found, the ones gone now: deleted here (or by
                -- another writer meanwhile, which counted them: they count nothing twice).
                v_linked := ARRAY(SELECT DISTINCT l.id FROM unnest(v_linked) AS l(id)
                                   WHERE NOT EXISTS (SELECT 1 FROM forge.jobs_live j
                                                      WHERE j.id = l.id OFFSET 0));
            END IF;
            -- Parents completed (and rows deleted that have dependencies): their children
            -- count it in this transaction (see forge.jobs_parent_finished).
            IF cardinality(v_linked) > 0 THEN
                PERFORM forge.jobs_parent_finished(
                    v_linked, array_fill('completed'::text, ARRAY[cardinality(v_linked)]),
                    NOT p_keep_completed);
            END IF;
        END IF;
        IF v_applied < cardinality(p_ids) THEN
            -- Not all were recorded: report the ones taken away from this node (a job its
            -- handler completed in its own transaction counts as recorded; when completed
            -- jobs are deleted, so does a job that is gone).
            RETURN QUERY
            SELECT o.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                   NULL::bigint, NULL::double precision, 'refused'::text, NULL::smallint,
                   NULL::timestamptz
              FROM unnest(p_ids, p_attempts) AS o(id, attempt)
             WHERE NOT EXISTS (SELECT 1 FROM forge.jobs_done j
                                WHERE j.id = o.id
                                  AND j.attempt = o.attempt AND j.node_id = p_node OFFSET 0)
               AND (p_keep_completed
                    OR EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = o.id OFFSET 0));
        END IF;
    ELSIF cardinality(p_ids) > 0 THEN
        -- The reported jobs still running this attempt here (the guard), with their rows.
        WITH o AS MATERIALIZED (
            SELECT o.*, x.tid
              FROM (SELECT o.*, 'running'::text AS running
                      FROM unnest(p_ids, p_attempts, p_states, p_delays_ms, p_errors)
                           AS o(id, attempt, state, delay_ms, error) OFFSET 0) o
             CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs_live j
                                  WHERE j.id = o.id AND j.attempt = o.attempt
                                    AND j.node_id = p_node AND j.state = o.running
                                  LIMIT 1 FOR NO KEY UPDATE) x
        ), d AS (
            -- Completed jobs are deleted when they are not kept.
            DELETE FROM forge.jobs_live j
             USING o
             WHERE NOT p_keep_completed AND o.state = 'completed'
               AND j.ctid = ANY (ARRAY(SELECT o.tid FROM o)) AND j.ctid = o.tid
            RETURNING j.id, 'completed'::text AS state, j.run_at, j.queue, j.role,
                      j.has_children OR j.parents IS NOT NULL AS linked, true AS gone
        ), u AS (
            UPDATE forge.jobs_live j
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
             WHERE o.state <> 'completed'
               AND j.ctid = ANY (ARRAY(SELECT o.tid FROM o)) AND j.ctid = o.tid
            RETURNING j.id, j.state, j.run_at, j.queue, j.role, j.has_children AS linked,
                      false AS gone
        ), m AS (
            -- Kept completed jobs move to forge.jobs_done (rows locked above: no creators).
            SELECT m.id, 'completed'::text AS state, m.run_at, m.queue, m.role,
                   m.has_children AS linked, false AS gone
              FROM forge.jobs_move_done(ARRAY(SELECT o.tid FROM o WHERE o.state = 'completed'
                                                                   AND p_keep_completed),
                                        NULL, p_node) m
        ), a AS (
            SELECT * FROM u UNION ALL SELECT * FROM d UNION ALL SELECT * FROM m
        )
        SELECT array_agg(a.id), array_agg(a.state),
               min(a.run_at) FILTER (WHERE a.state = 'retryable'),
               array_agg(DISTINCT CASE WHEN a.role IS NULL THEN a.queue ELSE '@' || a.role END)
                   FILTER (WHERE a.state = 'available'),
               array_agg(a.id) FILTER (WHERE a.linked AND NOT a.gone
                                         AND a.state IN ('completed', 'dead', 'cancelled')),
               array_agg(a.state) FILTER (WHERE a.linked AND NOT a.gone
                                            AND a.state IN ('completed', 'dead', 'cancelled')),
               array_agg(a.id) FILTER (WHERE a.linked AND a.gone)
          INTO v_ids, v_states, v_due, v_wake, v_linked, v_linked_ends, v_gone
          FROM a;
        -- Parents that ended, and rows deleted that have dependencies: their children count it
        -- in this transaction (see forge.jobs_parent_finished).
        IF v_linked IS NOT NULL THEN
            PERFORM forge.jobs_parent_finished(v_linked, v_linked_ends, false);
        END IF;
        IF v_gone IS NOT NULL THEN
            PERFORM forge.jobs_parent_finished(
                v_gone, array_fill('completed'::text, ARRAY[cardinality(v_gone)]), true);
        END IF;
        IF v_due IS NOT NULL THEN
            PERFORM pg_notify('forge_jobs_due',
                              p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
        END IF;
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
        -- The exceptions: recorded otherwise than asked, or refused.
        RETURN QUERY
        SELECT o.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
               NULL::bigint, NULL::double precision, coalesce(a.state, 'refused'), NULL::smallint,
               NULL::timestamptz
          FROM unnest(p_ids, p_attempts, p_states) AS o(id, attempt, asked)
          LEFT JOIN unnest(v_ids, v_states) AS a(id, state) ON a.id = o.id
         WHERE CASE WHEN a.id IS NOT NULL
                    THEN a.state <> CASE o.asked WHEN 'released' THEN 'available' ELSE o.asked END
                    ELSE NOT (o.asked = 'completed' AND (EXISTS (
                             SELECT 1 FROM forge.jobs_done j
                              WHERE j.id = o.id
                                AND j.attempt = o.attempt AND j.node_id = p_node OFFSET 0)
                             OR (NOT p_keep_completed
                                 AND NOT EXISTS (SELECT 1 FROM forge.jobs j
                                                  WHERE j.id = o.id OFFSET 0))))
               END;
    END IF;

    IF cardinality(p_ids) > 0 AND p_queue IS NOT NULL AND p_role IS NULL
       AND (v_kinds_limited
            OR EXISTS (SELECT 1 FROM forge.queue_limits l
                        WHERE l.namespace = p_namespace AND l.queue = p_queue
                          AND l.global_concurrency IS NOT NULL)) THEN
        -- Attempts of a queue with a global limit ended: a slot may be free for any node.
        -- (Of a limited kind: for this queue's workers; those of other queues that hold the
        -- kind's jobs claim again within a second.)
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || p_queue);
    END IF;

    IF p_limit <= 0 OR (p_role IS NOT NULL
                        AND NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure))
       OR (p_queue IS NOT NULL AND EXISTS (SELECT 1 FROM forge.queues q
                                            WHERE q.namespace = p_namespace AND q.queue = p_queue)) THEN
        -- Nothing to claim, deposed, or the queue is paused.
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM forge.job_lanes l
                    WHERE l.namespace = p_namespace AND l.node_id = p_node AND l.lane = v_lane
                      AND l.incarnation = p_incarnation AND l.generation = p_generation) THEN
        -- Not the lane's identity (see the header): claim nothing.
        RETURN QUERY SELECT NULL::bigint, false, NULL::text, NULL::jsonb, NULL::integer,
                            NULL::integer, NULL::bigint, NULL::double precision, 'stale'::text,
                            NULL::smallint, NULL::timestamptz;
        RETURN;
    END IF;
    IF v_kinds_limited THEN
        -- What of the worker's limited kinds is out of reach now, read without their limit
        -- locks (the claim's limited jobs are checked again under them, below): the claim
        -- passes over the jobs of a kind at a limit and of a spent rate key, so that they
        -- cannot crowd the head of the queue and starve the jobs behind them.
        SELECT array_agg(k.kind) FILTER (WHERE k.room <= 0
                                           OR (k.rate_key IS NULL AND k.spent IS NOT NULL)),
               array_agg(s.pair) FILTER (WHERE s.pair IS NOT NULL),
               array_agg(k.kind) FILTER (WHERE k.rate_key IS NOT NULL),
               array_agg(k.rate_key) FILTER (WHERE k.rate_key IS NOT NULL),
               min(k.wait_ms)
          INTO v_full_kinds, v_spent, v_keyed_kinds, v_key_args, v_kl_wait
          FROM forge.kind_limits_now(p_namespace, p_kinds) k
          LEFT JOIN LATERAL (SELECT k.kind || E'\x1f' || x AS pair FROM unnest(k.spent) AS x
                              WHERE k.rate_key IS NOT NULL) s ON true;
        SELECT coalesce(array_agg(x.kind), '{}') INTO v_open_kinds
          FROM unnest(p_kinds) AS x(kind) WHERE x.kind <> ALL (coalesce(v_full_kinds, '{}'));
    END IF;
    IF p_role IS NULL THEN
        SELECT * INTO v_limits FROM forge.queue_limits l
         WHERE l.namespace = p_namespace AND l.queue = p_queue
           AND (l.global_concurrency IS NOT NULL OR l.rate_count IS NOT NULL);
        IF FOUND THEN
            v_limited := true;
            v_limit_locked := forge.limit_lock('forge.queue_limit',
                                               p_namespace || ' ' || p_queue, 250);
        END IF;
        IF v_limited AND NOT v_limit_locked THEN
            -- The queue's limit lock is held longer than a claim takes (see forge.limit_lock):
            -- claim nothing this time, and again in a moment.
            p_limit := 0;
            v_wait := 100;
        ELSIF v_limited THEN
            -- The queue's limit lock is held: its limits again, they may have changed meanwhile.
            SELECT * INTO v_limits FROM forge.queue_limits l
             WHERE l.namespace = p_namespace AND l.queue = p_queue;
            p_limit := least(p_limit, p_start);
            IF p_limit <= 0 THEN
                v_wait := 0;
            END IF;
            IF v_limits.global_concurrency IS NOT NULL THEN
                -- The slots of attempts that ended are free (see migration 0013).
                DELETE FROM forge.queue_slots s
                 WHERE s.namespace = p_namespace AND s.queue = p_queue
                   AND NOT EXISTS (SELECT 1 FROM forge.jobs_live j
                                    WHERE j.id = s.job_id AND j.attempt = s.attempt
                                      AND j.state = 'running');
                SELECT v_limits.global_concurrency - count(*) INTO v_room FROM forge.queue_slots s
                 WHERE s.namespace = p_namespace AND s.queue = p_queue;
                IF v_room < p_limit THEN
                    p_limit := greatest(v_room, 0);
                    v_wait := 1000;
                END IF;
            END IF;
            IF v_limits.rate_count IS NOT NULL AND p_limit > 0 THEN
                DELETE FROM forge.queue_claims c
                 WHERE c.namespace = p_namespace AND c.queue = p_queue
                   AND c.claimed_at <= clock_timestamp()
                                       - v_limits.rate_window_ms * interval '1 millisecond';
                IF v_limits.rate_key IS NULL THEN
                    SELECT v_limits.rate_count - count(*) INTO v_budget FROM forge.queue_claims c
                     WHERE c.namespace = p_namespace AND c.queue = p_queue AND c.rate_key = '';
                    IF v_budget < p_limit THEN
                        p_limit := greatest(v_budget, 0);
                        SELECT least(v_wait, greatest(extract(epoch FROM min(c.claimed_at)
                                   + v_limits.rate_window_ms * interval '1 millisecond'
                                   - clock_timestamp()) * 1000, 1))
                          INTO v_wait FROM forge.queue_claims c
                         WHERE c.namespace = p_namespace AND c.queue = p_queue AND c.rate_key = '';
                    END IF;
                ELSIF p_limit > 0 THEN
                    -- Per rate key: the first jobs of the queue (up to 10 times the claim's
                    -- size, and 100 more), of which each key's first ones within its budget.
                    SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
                      FROM (SELECT w.*, row_number() OVER (PARTITION BY w.rate_key
                                                           ORDER BY w.priority, w.run_at, w.id) AS nth
                              FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at,
                                           coalesce(j.args ->> v_limits.rate_key, '') AS rate_key
                                      FROM forge.jobs_live j
                                     WHERE j.namespace = p_namespace AND j.queue = p_queue
                                       AND j.phase = 'ready' AND j.state = 'available'
                                       AND j.role IS NULL
                                       AND j.kind = ANY (v_open_kinds)
                                       AND (v_spent IS NULL OR j.kind || E'\x1f' || coalesce(j.args ->> v_key_args[
                                           array_position(v_keyed_kinds, j.kind)], '') <> ALL (v_spent))
                                     ORDER BY j.priority, j.run_at, j.id
                                     LIMIT p_limit * 10 + 100
                                       FOR UPDATE SKIP LOCKED) w) c
                     WHERE c.nth <= v_limits.rate_count
                                    - (SELECT count(*) FROM forge.queue_claims q
                                        WHERE q.namespace = p_namespace AND q.queue = p_queue
                                          AND q.rate_key = c.rate_key);
                    v_tids := v_tids[1:p_limit];
                    IF coalesce(cardinality(v_tids), 0) < p_limit THEN
                        -- (Perhaps only the end of the queue: then the wait is moot, as a
                        -- new job wakes the workers.)
                        SELECT least(v_wait, greatest(extract(epoch FROM min(c.claimed_at)
                                   + v_limits.rate_window_ms * interval '1 millisecond'
                                   - clock_timestamp()) * 1000, 1))
                          INTO v_wait FROM forge.queue_claims c
                         WHERE c.namespace = p_namespace AND c.queue = p_queue;
                        p_limit := coalesce(cardinality(v_tids), 0);
                    END IF;
                END IF;
            END IF;
            v_limited := true;
        END IF;
    END IF;
    IF v_limited THEN
        -- The queue limits' row: the worker claims nothing ahead, and claims again after
        -- pickup_ms when the claim was cut short (NULL: it was not).
        RETURN QUERY SELECT NULL::bigint, false, NULL::text, NULL::jsonb, NULL::integer,
                            NULL::integer, NULL::bigint, v_wait, 'limited'::text,
                            NULL::smallint, NULL::timestamptz;
        IF p_limit <= 0 THEN
            RETURN;
        END IF;
    END IF;
    -- Claims of one queue on several nodes run side by side: SKIP LOCKED skips the rows another
    -- claim has locked, and re-checks (EvalPlanQual) and drops those committed after this
    -- statement's snapshot. (They used to take turns under an advisory lock, which spared that
    -- re-check; but a claimant frozen with its answer unsent held it, and every node's claims of
    -- the queue waited behind it until the frozen node was marked down.)
    -- Three branches, so that each matches its partial index (jobs_claim, jobs_claim_role) in
    -- plpgsql's cached generic plan. A queue worker may pass its floor: the claim order's
    -- position of the last job it claimed. The claim then starts after it, instead of walking
    -- the index entries of the jobs claimed before (dead, but not removable while any
    -- snapshot may still see them: a standby waiting in its lock holds one for up to
    -- lock_timeout). The worker claims from the head now and then, and whenever a claim
    -- from its floor comes back short, for jobs that sort before it (a higher priority, a
    -- promoted scheduled job, a job another claimer had locked).
    -- (Twice at most: see the end of this loop.)
    FOR v_round IN 1..2 LOOP
        IF v_limits.rate_key IS NOT NULL THEN
            NULL; -- claimed above, per rate key
        ELSIF p_role IS NULL AND p_after_id IS NOT NULL THEN
            SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
              FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs_live j
                     WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.phase = 'ready'
                       AND j.state = 'available'
                       AND j.role IS NULL AND j.kind = ANY (v_open_kinds)
                       AND (v_spent IS NULL OR j.kind || E'\x1f' || coalesce(j.args ->> v_key_args[
                                array_position(v_keyed_kinds, j.kind)], '') <> ALL (v_spent))
                       AND (j.priority, j.run_at, j.id) > (p_after_priority, p_after_run_at, p_after_id)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED) c;
        ELSIF p_role IS NULL THEN
            SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
              FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs_live j
                     WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.phase = 'ready'
                       AND j.state = 'available'
                       AND j.role IS NULL AND j.kind = ANY (v_open_kinds)
                       AND (v_spent IS NULL OR j.kind || E'\x1f' || coalesce(j.args ->> v_key_args[
                                array_position(v_keyed_kinds, j.kind)], '') <> ALL (v_spent))
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED) c;
        ELSE
            SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
              FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs_live j
                     WHERE j.namespace = p_namespace AND j.role = p_role
                       AND (p_queue IS NULL OR j.queue = p_queue)
                       AND NOT EXISTS (SELECT 1 FROM forge.queues q
                                        WHERE q.namespace = p_namespace AND q.queue = j.queue)
                       AND j.phase = 'ready' AND j.state = 'available'
                       AND j.kind = ANY (p_kinds)
                     ORDER BY j.priority, j.run_at, j.id
                     LIMIT p_limit
                       FOR UPDATE SKIP LOCKED) c;
        END IF;
        IF v_kinds_limited AND v_tids IS NOT NULL THEN
            -- The limited kinds among the jobs found: their limit locks, in the order of their names
            -- (after the queue's: every claim takes them in this order; a claim waits for them only
            -- while holding rows no holder of a kind's lock waits for), then their limits and what
            -- counts against them, read in statements that begin after the locks (as for the
            -- queue's, above), and of the jobs found, each limited kind's first ones within its
            -- room and its rate key's budget, and of those only as many as start now.
            FOR v_kind IN SELECT DISTINCT j.kind FROM forge.jobs_live j
                            JOIN forge.kind_limits k ON k.namespace = p_namespace AND k.kind = j.kind
                           WHERE j.ctid = ANY (v_tids) ORDER BY j.kind LOOP
                IF v_kind = ANY (v_kl_kinds) THEN
                    CONTINUE; -- taken in the first round
                ELSIF forge.limit_lock('forge.kind_limit', p_namespace || ' ' || v_kind, 250) THEN
                    v_kl_kinds := v_kl_kinds || v_kind;
                ELSE
                    -- Held longer than a claim takes (see forge.limit_lock): none of the kind's jobs
                    -- this time; the worker claims again in a moment (as for a queue's lock).
                    v_tids := ARRAY(SELECT t FROM unnest(v_tids) AS t
                                     WHERE NOT EXISTS (SELECT 1 FROM forge.jobs_live j
                                                        WHERE j.ctid = t AND j.kind = v_kind));
                    v_kl_wait := least(coalesce(v_kl_wait, 100), 100);
                    v_kl_busy := true;
                    v_busy_kinds := v_busy_kinds || v_kind;
                END IF;
            END LOOP;
        END IF;
        -- The jobs of a kind whose lock was held too long were left out, and they may have taken
        -- every place of the claim (a backlog of the kind at the head of the queue): as long as
        -- the lock's holder is frozen, the other kinds' jobs behind them would never be claimed.
        -- So the claim looks once more, without those kinds. (A kind taken in the first round
        -- keeps its lock; one first found in the second may be locked out of the names' order,
        -- which costs at most forge.limit_lock's wait, not a deadlock. A queue's rate key claims
        -- per key above, once.)
        EXIT WHEN v_busy_kinds IS NULL OR v_round = 2 OR v_limits.rate_key IS NOT NULL;
        v_open_kinds := ARRAY(SELECT k FROM unnest(v_open_kinds) AS k WHERE k <> ALL (v_busy_kinds));
        v_busy_kinds := NULL;
        EXIT WHEN cardinality(v_open_kinds) = 0;
    END LOOP;
    IF v_kl_kinds IS NOT NULL THEN
        DELETE FROM forge.kind_claims c USING forge.kind_limits k
         WHERE k.namespace = p_namespace AND k.kind = ANY (v_kl_kinds)
           AND c.namespace = p_namespace AND c.kind = k.kind
           AND c.claimed_at <= clock_timestamp() - k.rate_window_ms * interval '1 millisecond';
        -- The slots of attempts that ended are free (see migration 0014).
        DELETE FROM forge.kind_slots s
         WHERE s.namespace = p_namespace AND s.kind = ANY (v_kl_kinds)
           AND NOT EXISTS (SELECT 1 FROM forge.jobs_live j
                            WHERE j.id = s.job_id AND j.attempt = s.attempt
                              AND j.state = 'running');
        SELECT array_agg(k.kind), array_agg(k.room), array_agg(k.rate_count),
               array_agg(k.rate_key), array_agg(k.kind) FILTER (WHERE k.room IS NOT NULL)
          INTO v_kl_kinds, v_kl_room, v_kl_rate, v_kl_key, v_kl_global
          FROM forge.kind_limits_now(p_namespace, v_kl_kinds) k;
        v_found := cardinality(v_tids);
        SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id),
               array_agg(c.tid) FILTER (WHERE c.kl)
          INTO v_tids, v_kl_tids
          FROM (SELECT c.*, row_number() OVER (PARTITION BY c.kl
                                               ORDER BY c.priority, c.run_at, c.id) AS nth_kl
                  FROM (SELECT w.*, coalesce(w.kind = ANY (v_kl_kinds), false) AS kl,
                               row_number() OVER (PARTITION BY w.kind
                                                  ORDER BY w.priority, w.run_at, w.id) AS nth,
                               row_number() OVER (PARTITION BY w.kind, w.rate_key
                                                  ORDER BY w.priority, w.run_at, w.id) AS nth_key
                          FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at, j.kind, l.room,
                                       l.rate_count,
                                       CASE WHEN l.rate_key IS NULL THEN ''
                                            ELSE coalesce(j.args ->> l.rate_key, '') END AS rate_key
                                  FROM forge.jobs_live j
                                  LEFT JOIN unnest(v_kl_kinds, v_kl_room, v_kl_rate, v_kl_key)
                                            AS l(kind, room, rate_count, rate_key) ON l.kind = j.kind
                                 WHERE j.ctid = ANY (v_tids)) w) c
                 WHERE (c.room IS NULL OR c.nth <= c.room)
                   AND (c.rate_count IS NULL
                        OR c.nth_key <= c.rate_count - (SELECT count(*) FROM forge.kind_claims q
                                                         WHERE q.namespace = p_namespace
                                                           AND q.kind = c.kind
                                                           AND q.rate_key = c.rate_key))) c
         WHERE NOT c.kl OR c.nth_kl <= p_start;
        IF coalesce(cardinality(v_tids), 0) < v_found THEN
            -- Cut: claim again at once (from the head: the next claim passes over what is out
            -- of reach now).
            v_kl_wait := 0;
        END IF;
        -- One instant for the claims counted and the jobs' attempted_at (as for a queue's).
        v_claimed_at := clock_timestamp();
        INSERT INTO forge.kind_claims (namespace, kind, rate_key, claimed_at)
        SELECT p_namespace, j.kind,
               CASE WHEN l.rate_key IS NULL THEN '' ELSE coalesce(j.args ->> l.rate_key, '') END,
               v_claimed_at
          FROM forge.jobs_live j
          JOIN unnest(v_kl_kinds, v_kl_rate, v_kl_key) AS l(kind, rate_count, rate_key)
            ON l.kind = j.kind AND l.rate_count IS NOT NULL
         WHERE j.ctid = ANY (v_kl_tids);
        -- A slot per attempt claimed under a kind's global limit (taking over the slot of the
        -- job's earlier attempt, ended since the prune).
        INSERT INTO forge.kind_slots AS s (namespace, kind, job_id, attempt)
        SELECT p_namespace, j.kind, j.id, j.attempt + 1 FROM forge.jobs_live j
         WHERE j.ctid = ANY (v_kl_tids) AND j.kind = ANY (v_kl_global)
        ON CONFLICT (namespace, kind, job_id) DO UPDATE SET attempt = EXCLUDED.attempt;
    END IF;
    IF v_full_kinds IS NOT NULL OR v_spent IS NOT NULL OR v_kl_wait = 0 OR v_kl_busy THEN
        -- The kinds' row: jobs were passed over or cut, so the worker claims from the head next
        -- time (not past its floor), and, if this claim comes back short, again after
        -- pickup_ms (at once after a cut; when the first of them may be in reach otherwise).
        RETURN QUERY SELECT NULL::bigint, false, NULL::text, NULL::jsonb, NULL::integer,
                            NULL::integer, NULL::bigint, v_kl_wait, 'paced'::text,
                            NULL::smallint, NULL::timestamptz;
    END IF;
    -- The claimed rows, locked above, by ctid: the first p_start of the claim order start now
    -- (the slice taken once, not once per row).
    IF v_limits.rate_count IS NOT NULL THEN
        -- One instant for the claim's rows here and its jobs' attempted_at: the window a claim
        -- counts is the one its jobs show.
        v_claimed_at := coalesce(v_claimed_at, clock_timestamp());
        INSERT INTO forge.queue_claims (namespace, queue, rate_key, claimed_at)
        SELECT p_namespace, p_queue,
               CASE WHEN v_limits.rate_key IS NULL THEN ''
                    ELSE coalesce(j.args ->> v_limits.rate_key, '') END,
               v_claimed_at
          FROM forge.jobs_live j WHERE j.ctid = ANY (v_tids);
    END IF;
    IF v_limits.global_concurrency IS NOT NULL THEN
        -- A slot per attempt claimed under the global limit (all of them start: see above).
        -- (A slot left by the job's earlier attempt, ended since the prune, is taken over.)
        INSERT INTO forge.queue_slots AS s (namespace, queue, job_id, attempt)
        SELECT p_namespace, p_queue, j.id, j.attempt + 1 FROM forge.jobs_live j
         WHERE j.ctid = ANY (v_tids)
        ON CONFLICT (namespace, queue, job_id) DO UPDATE SET attempt = EXCLUDED.attempt;
    END IF;
    v_start_all := p_start >= coalesce(cardinality(v_tids), 0);
    IF NOT v_start_all AND v_kl_tids IS NOT NULL THEN
        -- The limited rows start now, and as many others, first in the claim order, as slots
        -- are left.
        v_start := v_kl_tids || ARRAY(SELECT t FROM unnest(v_tids) AS t
                                       WHERE t <> ALL (v_kl_tids)
                                       LIMIT greatest(p_start - cardinality(v_kl_tids), 0));
    ELSIF NOT v_start_all THEN
        v_start := v_tids[1:p_start];
    END IF;
    -- The claim: the job's state, node, attempt and times, none of which an index names, so a
    -- HOT update (phase stays 'ready': migration 0016). Its lane's list names it from the same
    -- statement on: at every commit the list holds each running job of the lane that is not
    -- busy, which is how rescue and reconciliation find it (forge.jobs_running). The list is
    -- then the jobs the worker holds (p_held) and these claims. That cannot leave out a running
    -- job of the lane: only claims write 'running' with a list; a worker's claims are one at a
    -- time (one in flight; one it gave up on was waited for or ended by its reconciliation,
    -- forge.jobs_lane_take, which rebuilt the list from the jobs running); and a job it holds
    -- is in p_held until the round trip that records its outcome has committed. An orphan the
    -- last reconciliation could not lock (not held, still running) stays listed through
    -- l.unsettled until the next one settles it. Without p_held,
    -- the list's jobs that this statement sees running on this node (a primary-key probe each,
    -- about 9k instructions per job: the worker's p_held saves them); no claim of the lane
    -- committed after this statement's snapshot, as above.
    RETURN QUERY
    WITH c AS (
        UPDATE forge.jobs_live j
           SET state = 'running', phase = 'ready', attempt = j.attempt + 1, node_id = p_node,
               epoch = CASE WHEN p_role IS NOT NULL THEN p_epoch END,
               tenure = CASE WHEN p_role IS NOT NULL THEN p_tenure END,
               attempted_at = coalesce(v_claimed_at, clock_timestamp()),
               started_at = CASE WHEN v_start_all OR j.ctid = ANY (v_start)
                                 THEN coalesce(v_claimed_at, clock_timestamp()) END
         WHERE j.ctid = ANY (v_tids)
        -- (date_part is a float8; extract's numeric, cast to float8 through its text, cost 1.6k
        -- instructions per job.)
        RETURNING j.id, true AS claimed, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
                  date_part('epoch', j.attempted_at - j.run_at) * 1000 AS pickup_ms,
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END AS state,
                  j.priority, j.run_at
    ), listed AS (
        UPDATE forge.job_lanes l
           SET running = coalesce(p_held,
                                  ARRAY(SELECT k.id FROM unnest(l.running) AS k(id)
                                         WHERE EXISTS (SELECT 1 FROM forge.jobs_live j
                                                        WHERE j.id = k.id AND j.state = 'running'
                                                          AND j.node_id = p_node
                                                       OFFSET 0)))
                         || l.unsettled || ARRAY(SELECT c.id FROM c)
         WHERE l.namespace = p_namespace AND l.node_id = p_node AND l.lane = v_lane
           AND cardinality(v_tids) > 0
    )
    SELECT * FROM c;
END;
$$;
