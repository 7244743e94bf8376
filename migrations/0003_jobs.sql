-- FORGE jobs: the durable job queue (forge.jobs), node heartbeats (forge.nodes), and the
-- functions that enqueue, claim, finish, cancel, promote and rescue jobs, one round trip each.
--
-- Who writes which transition (see ARCHITECTURE.md, "Jobs"):
--   enqueuer        -> available | scheduled                  forge.jobs_enqueue
--   any worker      available -> running                      forge.jobs_step (claim, SKIP LOCKED)
--   that worker     running -> completed | retryable | available | dead | cancelled
--                                                             forge.jobs_step (outcomes, guarded by
--                                                             id + attempt + node + state)
--   scheduler lead  scheduled | retryable -> available        forge.jobs_promote
--   scheduler lead  running (node gone) -> available | dead | cancelled    forge.jobs_maintain
--   anyone          available | scheduled | retryable -> cancelled;
--                   running -> cancel_requested (+ NOTIFY)    forge.jobs_cancel
--
-- Notifications (payloads are space-separated, namespace first):
--   forge_jobs         '<ns> <queue>' or '<ns> @<role>': jobs became available
--   forge_jobs_due     '<ns> <unix ms>': a scheduled job or retry is due then
--   forge_jobs_cancel  '<ns> <node> <job id>': cancel a running job on that node

CREATE TABLE forge.jobs (
    id               bigserial   PRIMARY KEY,
    namespace        text        NOT NULL,
    queue            text        NOT NULL,
    kind             text        NOT NULL,
    args             jsonb       NOT NULL,
    state            text        NOT NULL
                     CHECK (state IN ('available', 'scheduled', 'running', 'retryable',
                                      'completed', 'dead', 'cancelled')),
    priority         smallint    NOT NULL DEFAULT 0,
    -- When the job is (or was) due: enqueue time, the requested run-at, or the end of a backoff.
    run_at           timestamptz NOT NULL,
    -- Attempts started so far; the running attempt's number while running.
    attempt          integer     NOT NULL DEFAULT 0,
    -- NULL: [jobs] default_max_attempts of the node that handles it.
    max_attempts     integer     CHECK (max_attempts > 0),
    timeout_ms       bigint      CHECK (timeout_ms > 0),
    -- Jobs with a role run only on that role's leader, under the epoch recorded at claim.
    role             text,
    epoch            bigint,
    unique_key       text,
    -- The node of the current (or last) attempt.
    node_id          text,
    attempted_at     timestamptz,
    finished_at      timestamptz,
    -- One object per failed, interrupted or rescued attempt: {at, attempt, node, reason, error}.
    errors           jsonb       NOT NULL DEFAULT '[]',
    cancel_requested boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Claiming: the next jobs of a queue in (priority, run_at, id) order, without role.
CREATE INDEX jobs_claim ON forge.jobs (namespace, queue, priority, run_at, id)
    WHERE state = 'available' AND role IS NULL;
-- Claiming by a role's leader.
CREATE INDEX jobs_claim_role ON forge.jobs (namespace, role, queue, priority, run_at, id)
    WHERE state = 'available' AND role IS NOT NULL;
-- Promotion: the earliest due scheduled job or retry.
CREATE INDEX jobs_due ON forge.jobs (namespace, run_at) WHERE state IN ('scheduled', 'retryable');
-- Rescue: running jobs by node.
CREATE INDEX jobs_running ON forge.jobs (namespace, node_id) WHERE state = 'running';
-- Pruning by retention.
CREATE INDEX jobs_finished ON forge.jobs (namespace, state, finished_at) WHERE finished_at IS NOT NULL;
-- Unique jobs: one unfinished job per (kind, key).
CREATE UNIQUE INDEX jobs_unique ON forge.jobs (namespace, kind, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable');

COMMENT ON TABLE forge.jobs IS
    'FORGE''s durable jobs. state: available, scheduled, running, retryable -> completed, dead (the dead-letter state), cancelled.';

CREATE TABLE forge.nodes (
    namespace    text        NOT NULL,
    node_id      text        NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    stopped_at   timestamptz,
    -- The queues the node works, with their concurrency (for operators).
    queues       jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (namespace, node_id)
);

COMMENT ON TABLE forge.nodes IS
    'Nodes working jobs, with their heartbeat: the scheduler leader rescues running jobs of nodes that stopped heartbeating.';

-- Enqueues a batch of jobs in one statement. Arrays are parallel, one element per job. A unique
-- job that collides with an unfinished job of the same kind and key is not inserted; the row
-- for it reports inserted = false and the id of the job it collided with.
CREATE FUNCTION forge.jobs_enqueue(
    p_namespace    text,
    p_queues       text[],
    p_kinds        text[],
    p_args         jsonb[],
    p_priorities   smallint[],
    p_run_at       timestamptz[],
    p_delays_ms    bigint[],
    p_max_attempts integer[],
    p_timeouts_ms  bigint[],
    p_roles        text[],
    p_unique_keys  text[],
    p_unique       boolean[]
) RETURNS TABLE (ord integer, id bigint, inserted boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_ids  bigint[];
    v_new  bigint[];
    v_wake text[];
    v_due  timestamptz;
    v_set  jsonb;
BEGIN
    -- Ids first, so that each input row knows its id whether or not it is inserted.
    SELECT array_agg(nextval('forge.jobs_id_seq') ORDER BY g) INTO v_ids
      FROM generate_series(1, cardinality(p_kinds)) AS g;

    WITH input AS (
        SELECT u.id, u.queue, u.kind, u.args, u.priority, u.max_attempts, u.timeout_ms, u.role,
               coalesce(u.unique_key, CASE WHEN u.is_unique THEN md5(u.args::text) END) AS unique_key,
               greatest(v_now, coalesce(u.at, v_now + coalesce(u.delay_ms, 0) * interval '1 millisecond')) AS run_at
          FROM unnest(v_ids, p_queues, p_kinds, p_args, p_priorities, p_run_at, p_delays_ms,
                      p_max_attempts, p_timeouts_ms, p_roles, p_unique_keys, p_unique)
               AS u(id, queue, kind, args, priority, at, delay_ms, max_attempts, timeout_ms, role,
                    unique_key, is_unique)
    ), ins AS (
        INSERT INTO forge.jobs AS j (id, namespace, queue, kind, args, state, priority, run_at,
                                     max_attempts, timeout_ms, role, unique_key, created_at)
        SELECT i.id, p_namespace, i.queue, i.kind, i.args,
               CASE WHEN i.run_at > v_now THEN 'scheduled' ELSE 'available' END,
               i.priority, i.run_at, i.max_attempts, i.timeout_ms, i.role, i.unique_key, v_now
          FROM input i
         ORDER BY i.id
        ON CONFLICT (namespace, kind, unique_key)
           WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable')
           DO NOTHING
        RETURNING j.id, j.queue, j.role, j.state, j.run_at
    )
    SELECT array_agg(ins.id),
           array_agg(DISTINCT CASE WHEN ins.role IS NULL THEN ins.queue ELSE '@' || ins.role END)
               FILTER (WHERE ins.state = 'available'),
           min(ins.run_at) FILTER (WHERE ins.state = 'scheduled')
      INTO v_new, v_wake, v_due
      FROM ins;

    -- Delivered on commit only: a rolled-back enqueue wakes nobody.
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    IF v_due IS NOT NULL THEN
        PERFORM pg_notify('forge_jobs_due',
                          p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
    END IF;

    -- Every row inserted (the common case): the ids are the answer.
    IF coalesce(cardinality(v_new), 0) = cardinality(v_ids) THEN
        RETURN QUERY SELECT t.ord::integer, t.id, true
                       FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
        RETURN;
    END IF;
    -- Some were duplicates. (A jsonb object as the set of inserted ids: a join of two unnest()
    -- calls gets a nested loop from the planner's 10-row guess, quadratic for big batches.)
    v_set := coalesce((SELECT jsonb_object_agg(x::text, true) FROM unnest(v_new) AS x), '{}');
    -- A duplicate reports the job it collided with. This runs as a new statement, so it sees a
    -- colliding job committed by a concurrent enqueuer after this call began.
    RETURN QUERY
    SELECT t.ord::integer,
           CASE WHEN v_set ? t.id::text THEN t.id
                ELSE (SELECT e.id FROM forge.jobs e
                       WHERE e.namespace = p_namespace AND e.kind = p_kinds[t.ord]
                         AND e.unique_key = coalesce(p_unique_keys[t.ord],
                               CASE WHEN p_unique[t.ord] THEN md5(p_args[t.ord]::text) END)
                       ORDER BY e.id DESC LIMIT 1) END,
           v_set ? t.id::text
      FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
END;
$$;

-- Gives running jobs back: retried at once (available), or dead when out of attempts, or
-- cancelled when a cancel was requested. Guarded by (id, attempt, state = running), so a job
-- that finished or was re-claimed meanwhile is left alone. The attempt counts.
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
    v_ns     text[];
BEGIN
    WITH r AS (
        UPDATE forge.jobs j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                            WHEN j.attempt >= coalesce(j.max_attempts, p_default_max_attempts) THEN 'dead'
                            ELSE 'available' END,
               finished_at = CASE WHEN j.cancel_requested
                                    OR j.attempt >= coalesce(j.max_attempts, p_default_max_attempts)
                                  THEN clock_timestamp() END,
               run_at = CASE WHEN j.cancel_requested
                               OR j.attempt >= coalesce(j.max_attempts, p_default_max_attempts)
                             THEN j.run_at ELSE clock_timestamp() END,
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'node', j.node_id,
                   'reason', 'rescued', 'error', l.reason))
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

-- One round trip of a worker: record the outcomes of finished attempts, then claim up to
-- p_limit jobs. Returns the recorded outcomes (claimed = false, with the state written) and the
-- claimed jobs (claimed = true).
--
-- Outcomes: completed, retryable (after p_delays_ms), available (retry now), dead, cancelled,
-- released (interrupted by a graceful shutdown: available again; attempt numbers never go back,
-- so the interrupted attempt is not counted by raising max_attempts by one).
-- Each is applied only if the job is still running this attempt on this node, so a node that
-- was presumed dead and rescued cannot complete the job a second time.
CREATE FUNCTION forge.jobs_step(
    p_namespace text,
    p_node      text,
    p_queue     text,
    p_role      text,
    p_epoch     bigint,
    p_kinds     text[],
    p_limit     integer,
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
    IF cardinality(p_ids) > 0 THEN
        WITH o AS (
            SELECT * FROM unnest(p_ids, p_attempts, p_states, p_delays_ms, p_errors)
                       AS o(id, attempt, state, delay_ms, error)
        ), u AS (
            UPDATE forge.jobs j
               SET state = CASE
                       WHEN o.state IN ('retryable', 'available') AND j.cancel_requested THEN 'cancelled'
                       WHEN o.state = 'released' THEN 'available'
                       ELSE o.state END,
                   max_attempts = CASE WHEN o.state = 'released'
                       THEN coalesce(j.max_attempts, p_default_max_attempts) + 1
                       ELSE j.max_attempts END,
                   run_at = CASE
                       WHEN o.state = 'retryable'
                           THEN clock_timestamp() + coalesce(o.delay_ms, 0) * interval '1 millisecond'
                       WHEN o.state = 'available' THEN clock_timestamp()
                       ELSE j.run_at END,
                   finished_at = CASE
                       WHEN o.state IN ('completed', 'dead', 'cancelled')
                         OR (o.state IN ('retryable', 'available') AND j.cancel_requested)
                       THEN clock_timestamp() END,
                   errors = CASE WHEN o.error IS NULL THEN j.errors
                       ELSE j.errors || jsonb_build_array(jsonb_build_object(
                           'at', clock_timestamp(), 'attempt', j.attempt, 'node', p_node) || o.error)
                       END
              FROM o
             WHERE j.id = o.id AND j.attempt = o.attempt AND j.node_id = p_node
               AND j.state = 'running'
            RETURNING j.id, j.state, j.run_at, j.queue, j.role
        )
        SELECT array_agg(u.id), array_agg(u.state),
               min(u.run_at) FILTER (WHERE u.state = 'retryable'),
               array_agg(DISTINCT CASE WHEN u.role IS NULL THEN u.queue ELSE '@' || u.role END)
                   FILTER (WHERE u.state = 'available')
          INTO v_ids, v_states, v_due, v_wake
          FROM u;
        IF v_due IS NOT NULL THEN
            PERFORM pg_notify('forge_jobs_due',
                              p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
        END IF;
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
        RETURN QUERY SELECT d.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                            NULL::bigint, NULL::double precision, d.state
                       FROM unnest(v_ids, v_states) AS d(id, state);
    END IF;

    IF p_limit > 0 THEN
        IF p_role IS NULL THEN
            RETURN QUERY
            WITH c AS (
                SELECT j.id FROM forge.jobs j
                 WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.state = 'available'
                   AND j.role IS NULL AND j.kind = ANY (p_kinds)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED
            )
            UPDATE forge.jobs j
               SET state = 'running', attempt = j.attempt + 1, node_id = p_node, epoch = NULL,
                   attempted_at = clock_timestamp()
              FROM c
             WHERE j.id = c.id
            RETURNING j.id, true, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
                      extract(epoch FROM j.attempted_at - j.run_at)::double precision * 1000, j.state;
        ELSE
            -- Fenced: a deposed leader claims nothing.
            RETURN QUERY
            WITH c AS (
                SELECT j.id FROM forge.jobs j
                 WHERE j.namespace = p_namespace AND j.role = p_role AND j.queue = p_queue
                   AND j.state = 'available' AND j.kind = ANY (p_kinds)
                   AND EXISTS (SELECT 1 FROM forge.leaders l
                                WHERE l.namespace = p_namespace AND l.role = p_role
                                  AND l.epoch = p_epoch AND l.released_at IS NULL
                                  AND l.lease_until > clock_timestamp())
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED
            )
            UPDATE forge.jobs j
               SET state = 'running', attempt = j.attempt + 1, node_id = p_node, epoch = p_epoch,
                   attempted_at = clock_timestamp()
              FROM c
             WHERE j.id = c.id
            RETURNING j.id, true, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
                      extract(epoch FROM j.attempted_at - j.run_at)::double precision * 1000, j.state;
        END IF;
    END IF;
END;
$$;

-- A worker's check of its own running jobs, after a failed round trip or a LISTEN outage:
-- jobs running on this node for this worker that the worker does not know (a claim whose
-- response was lost, an ended role tenure) are rescued; for the jobs it knows, it learns
-- which were cancelled ('cancel') or taken away from it ('gone'). Role workers also rescue
-- jobs of their role left running under an older epoch, on any node.
CREATE FUNCTION forge.jobs_reconcile(
    p_namespace            text,
    p_node                 text,
    p_queue                text,
    p_role                 text,
    p_epoch                bigint,
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
           array_agg(CASE WHEN j.node_id = p_node AND coalesce(j.epoch, 0) >= coalesce(p_epoch, 0)
                          THEN 'orphaned: claimed by node ' || p_node || ' but not running there'
                          ELSE 'the leadership of role ' || j.role || ' at epoch ' || j.epoch || ' ended' END)
      INTO v_ids, v_attempts, v_reasons
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.state = 'running' AND j.queue = p_queue
       AND j.role IS NOT DISTINCT FROM p_role
       AND ((j.node_id = p_node AND NOT (j.id = ANY (p_ids)))
            OR (p_role IS NOT NULL AND j.epoch < p_epoch));
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

-- Cancels a job: a queued one (available, scheduled, retryable) at once; a running one by
-- setting cancel_requested and notifying its node, which stops the handler and records
-- 'cancelled' (a handler that completes first wins). Returns 'cancelled_now', 'requested',
-- 'finished:<state>' for a job that had already finished, or 'not_found'.
CREATE FUNCTION forge.jobs_cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
    v_node  text;
    v_ns    text;
BEGIN
    -- The job can move between the statements (claimed, finished); each statement sees the
    -- latest committed state, so a few rounds settle it.
    FOR i IN 1..5 LOOP
        UPDATE forge.jobs j
           SET state = 'cancelled', finished_at = clock_timestamp(),
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'reason', 'cancelled',
                   'error', 'cancelled before it ran'))
         WHERE j.id = p_id AND j.state IN ('available', 'scheduled', 'retryable');
        IF FOUND THEN
            RETURN 'cancelled_now';
        END IF;
        UPDATE forge.jobs j SET cancel_requested = true
         WHERE j.id = p_id AND j.state = 'running'
        RETURNING j.node_id, j.namespace INTO v_node, v_ns;
        IF FOUND THEN
            PERFORM pg_notify('forge_jobs_cancel', v_ns || ' ' || v_node || ' ' || p_id);
            RETURN 'requested';
        END IF;
        SELECT j.state INTO v_state FROM forge.jobs j WHERE j.id = p_id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        IF v_state IN ('completed', 'dead', 'cancelled') THEN
            RETURN 'finished:' || v_state;
        END IF;
    END LOOP;
    RETURN 'moving:' || v_state;
END;
$$;

-- Promotes due scheduled jobs and retries to available (at most p_limit), notifies their
-- queues, and returns how many were promoted, the server's clock, and how long until the next
-- one is due (NULL: none).
CREATE FUNCTION forge.jobs_promote(p_namespace text, p_limit integer)
RETURNS TABLE (promoted bigint, server_now timestamptz, next_due_in_ms double precision)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
    v_wake  text[];
    v_next  timestamptz;
BEGIN
    WITH p AS (
        UPDATE forge.jobs j SET state = 'available'
         WHERE j.id IN (SELECT d.id FROM forge.jobs d
                         WHERE d.namespace = p_namespace AND d.state IN ('scheduled', 'retryable')
                           AND d.run_at <= clock_timestamp()
                         ORDER BY d.run_at
                         LIMIT p_limit
                           FOR UPDATE SKIP LOCKED)
        RETURNING j.queue, j.role
    )
    SELECT count(*),
           array_agg(DISTINCT CASE WHEN p.role IS NULL THEN p.queue ELSE '@' || p.role END)
      INTO v_count, v_wake
      FROM p;
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    IF v_count >= p_limit THEN
        v_next := clock_timestamp();
    ELSE
        SELECT min(d.run_at) INTO v_next FROM forge.jobs d
         WHERE d.namespace = p_namespace AND d.state IN ('scheduled', 'retryable');
    END IF;
    RETURN QUERY SELECT v_count, clock_timestamp(),
                        extract(epoch FROM v_next - clock_timestamp())::double precision * 1000;
END;
$$;

-- The scheduler leader's pass: rescue running jobs whose node is gone, promote due jobs, prune
-- finished jobs and stale node rows, and report queue depths. Rows:
--   ('rescued', queue, kind, new state, n)   jobs taken back from dead or frozen nodes
--   ('pruned',  NULL,  NULL, state, n)       finished jobs deleted by retention
--   ('depth',   queue, kind, state, n)       unfinished jobs
--   ('next_due', NULL, NULL, NULL, ms)       how long until the next scheduled job is due
--   ('server_now', ...)                      with at = the server's clock
--
-- A node is gone when (a) it has no session left (its LISTEN and pool sessions are named
-- forge:listen:<node> and forge:pool:<node>), unless the server itself started less than
-- p_restart_grace_ms ago (nodes are still reconnecting), or (b) its heartbeat is older than
-- p_rescue_after_ms, or it stopped. A role job is also rescued when the leadership it ran
-- under ended.
CREATE FUNCTION forge.jobs_maintain(
    p_namespace              text,
    p_rescue_after_ms        bigint,
    p_restart_grace_ms       bigint,
    p_default_max_attempts   integer,
    p_completed_retention_ms bigint,
    p_dead_retention_ms      bigint,
    p_limit                  integer
) RETURNS TABLE (event text, queue text, kind text, state text, n double precision,
                 at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_trust_sessions boolean := pg_postmaster_start_time()
                                < clock_timestamp() - p_restart_grace_ms * interval '1 millisecond';
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
    v_pruned   bigint;
    v_count    bigint;
    v_promote  record;
BEGIN
    WITH live AS MATERIALIZED (
        SELECT a.application_name FROM pg_stat_activity a
         WHERE a.application_name LIKE 'forge:%'
    ), lost AS (
        SELECT j.id, j.attempt,
               CASE
                   WHEN j.role IS NOT NULL AND NOT EXISTS (
                           SELECT 1 FROM forge.leaders l
                            WHERE l.namespace = j.namespace AND l.role = j.role
                              AND l.epoch = j.epoch AND l.released_at IS NULL)
                       THEN 'the leadership of role ' || j.role || ' at epoch '
                            || coalesce(j.epoch::text, '?') || ' ended'
                   WHEN nd.stopped_at IS NOT NULL
                       THEN 'node ' || j.node_id || ' stopped without finishing the attempt'
                   WHEN v_trust_sessions AND NOT EXISTS (
                           SELECT 1 FROM live
                            WHERE live.application_name IN (left('forge:listen:' || j.node_id, 63),
                                                            left('forge:pool:' || j.node_id, 63)))
                       THEN 'node ' || j.node_id || ' has no database session (it died)'
                   WHEN coalesce(nd.heartbeat_at, j.attempted_at)
                        < clock_timestamp() - p_rescue_after_ms * interval '1 millisecond'
                       THEN 'node ' || j.node_id || ' has not heartbeated since '
                            || coalesce(nd.heartbeat_at, j.attempted_at)
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

    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state IN ('completed', 'cancelled')
                           AND f.finished_at < clock_timestamp() - p_completed_retention_ms * interval '1 millisecond'
                         LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_pruned FROM d;
    IF v_pruned > 0 THEN
        RETURN QUERY SELECT 'pruned', NULL::text, NULL::text, 'completed', v_pruned::double precision, NULL::timestamptz;
    END IF;
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.id IN (SELECT f.id FROM forge.jobs f
                         WHERE f.namespace = p_namespace AND f.state = 'dead'
                           AND f.finished_at < clock_timestamp() - p_dead_retention_ms * interval '1 millisecond'
                         LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_pruned FROM d;
    IF v_pruned > 0 THEN
        RETURN QUERY SELECT 'pruned', NULL::text, NULL::text, 'dead', v_pruned::double precision, NULL::timestamptz;
    END IF;
    DELETE FROM forge.nodes nd
     WHERE nd.namespace = p_namespace
       AND coalesce(nd.stopped_at, nd.heartbeat_at)
           < clock_timestamp() - greatest(p_completed_retention_ms, 2 * p_rescue_after_ms) * interval '1 millisecond'
       AND NOT EXISTS (SELECT 1 FROM forge.jobs j
                        WHERE j.namespace = nd.namespace AND j.node_id = nd.node_id AND j.state = 'running');

    SELECT * INTO v_promote FROM forge.jobs_promote(p_namespace, p_limit);
    RETURN QUERY SELECT 'next_due', NULL::text, NULL::text, NULL::text, v_promote.next_due_in_ms,
                        v_promote.server_now;

    RETURN QUERY
    SELECT 'depth', j.queue, j.kind, j.state, count(*)::double precision, NULL::timestamptz
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.state IN ('available', 'scheduled', 'running', 'retryable')
     GROUP BY j.queue, j.kind, j.state;
END;
$$;

-- A node starting to work jobs: records it in forge.nodes and rescues the jobs its previous
-- incarnation left running (node ids are unique in a cluster, so they cannot be running).
CREATE FUNCTION forge.jobs_node_start(
    p_namespace            text,
    p_node                 text,
    p_queues               jsonb,
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, queue text, kind text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
BEGIN
    INSERT INTO forge.nodes AS n (namespace, node_id, started_at, heartbeat_at, queues)
    VALUES (p_namespace, p_node, clock_timestamp(), clock_timestamp(), p_queues)
    ON CONFLICT (namespace, node_id) DO UPDATE
       SET started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
           stopped_at = NULL, queues = excluded.queues;
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
