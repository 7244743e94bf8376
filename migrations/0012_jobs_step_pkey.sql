-- FORGE jobs: the worker round trip's updates look their rows up by primary key, whatever the
-- statistics say.
--
-- forge.jobs_step (0006) matches the rows a worker reports on (started, completed, other
-- outcomes) by id, attempt and node, comparing state with 'running' through a column of the
-- reported rows so that the planner cannot pick the partial index jobs_running (node_id WHERE
-- state = 'running'). It could: PostgreSQL flattens the subquery, the column becomes the
-- constant 'running' again, and once ANALYZE has seen only a few running jobs the cached
-- generic plan hash-joins the reported ids against an index scan of all this node's
-- jobs_running entries. That scan is cheap while the entries of finished jobs get marked dead
-- as scans pass them, and costly when they cannot be: while any snapshot older than them is
-- open (a long query elsewhere, a count of a big backlog), every report walks the entries of
-- every job the node ran since (121-264 buffers for 1-2 rows, measured). One node's drain with
-- 1,000,000 queued and 10,000,000 finished jobs fell to 9,400-34,500 jobs/s (three runs of six
-- near 9,500); with primary-key lookups it is 32,300-45,700. The price: about a fifth of the
-- peak drain rate when nothing holds old snapshots (40,000-43,000 against 50,000-55,000 jobs/s),
-- for a rate that does not collapse. (Adding id to jobs_running and looking rows up there with
-- id = ANY (...) was slower than both.)
--
-- The same function, the reported rows kept a subquery (OFFSET 0, MATERIALIZED). Same
-- parameters, same rows returned.

CREATE OR REPLACE FUNCTION forge.jobs_step(
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
    p_default_max_attempts integer,
    p_after_priority smallint,
    p_after_run_at   timestamptz,
    p_after_id       bigint
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
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);

    IF cardinality(p_started) > 0 THEN
        -- (Primary-key lookups: OFFSET 0 keeps 'running' a column; see this file's header.)
        UPDATE forge.jobs j SET started_at = clock_timestamp()
          FROM (SELECT s.id, 'running'::text AS running FROM unnest(p_started) AS s(id)
                OFFSET 0) s
         WHERE j.id = s.id AND j.node_id = p_node AND j.state = s.running
           AND j.started_at IS NULL;
    END IF;

    IF cardinality(p_ids) > 0 AND p_states <@ ARRAY['completed'] THEN
        -- Only completions: one guarded update.
        UPDATE forge.jobs j
           SET state = 'completed', finished_at = clock_timestamp()
          FROM (SELECT o.id, o.attempt, 'running'::text AS running
                  FROM unnest(p_ids, p_attempts) AS o(id, attempt) OFFSET 0) o
         WHERE j.id = o.id AND j.attempt = o.attempt AND j.node_id = p_node
           AND j.state = o.running;
        GET DIAGNOSTICS v_applied = ROW_COUNT;
        IF v_applied < cardinality(p_ids) THEN
            -- Not all were recorded: report the ones taken away from this node (a job its
            -- handler completed in its own transaction counts as recorded).
            RETURN QUERY
            SELECT o.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                   NULL::bigint, NULL::double precision, 'refused'::text, NULL::smallint,
                   NULL::timestamptz
              FROM unnest(p_ids, p_attempts) AS o(id, attempt)
             WHERE NOT EXISTS (SELECT 1 FROM forge.jobs j
                                WHERE j.id = o.id AND j.state = 'completed'
                                  AND j.attempt = o.attempt AND j.node_id = p_node);
        END IF;
    ELSIF cardinality(p_ids) > 0 THEN
        WITH o AS MATERIALIZED (
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
        -- The exceptions: recorded otherwise than asked, or refused.
        RETURN QUERY
        SELECT o.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
               NULL::bigint, NULL::double precision, coalesce(a.state, 'refused'), NULL::smallint,
               NULL::timestamptz
          FROM unnest(p_ids, p_attempts, p_states) AS o(id, attempt, asked)
          LEFT JOIN unnest(v_ids, v_states) AS a(id, state) ON a.id = o.id
         WHERE CASE WHEN a.id IS NOT NULL
                    THEN a.state <> CASE o.asked WHEN 'released' THEN 'available' ELSE o.asked END
                    ELSE NOT (o.asked = 'completed' AND EXISTS (
                             SELECT 1 FROM forge.jobs j
                              WHERE j.id = o.id AND j.state = 'completed'
                                AND j.attempt = o.attempt AND j.node_id = p_node))
               END;
    END IF;

    IF p_limit <= 0 OR (p_role IS NOT NULL
                        AND NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure))
       OR (p_queue IS NOT NULL AND EXISTS (SELECT 1 FROM forge.queues q
                                            WHERE q.namespace = p_namespace AND q.queue = p_queue)) THEN
        -- Nothing to claim, deposed, or the queue is paused.
        RETURN;
    END IF;
    -- One claim of a queue (or a role's queue) at a time in the cluster. Claims running side
    -- by side would each walk the rows the other just took: SKIP LOCKED skips the rows
    -- locked now, but a row claimed and committed after this statement's snapshot is
    -- re-checked (EvalPlanQual) and dropped one by one, which costs more than waiting a few
    -- milliseconds for the other claim to commit. The claim below takes its snapshot after
    -- this lock, so it sees the other's claim. (Two-int advisory keys: another key space
    -- than the roles' bigint keys.)
    PERFORM pg_advisory_xact_lock(hashtext('forge.jobs_claim'),
                                  hashtext(p_namespace || ' ' || coalesce(p_queue, '@' || p_role)));
    -- Three branches, so that each matches its partial index (jobs_claim, jobs_claim_role) in
    -- plpgsql's cached generic plan. A queue worker may pass its floor: the claim order's
    -- position of the last job it claimed. The claim then starts after it, instead of walking
    -- the index entries of the jobs claimed before (dead, but not removable while any
    -- snapshot may still see them: a standby waiting in its lock holds one for up to
    -- lock_timeout). The worker claims from the head now and then, and whenever a claim
    -- from its floor comes back short, for jobs that sort before it (a higher priority, a
    -- promoted scheduled job, a job another claimer had locked).
    IF p_role IS NULL AND p_after_id IS NOT NULL THEN
        RETURN QUERY
        WITH c AS (
            SELECT j.id, j.priority, j.run_at FROM forge.jobs j
             WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.state = 'available'
               AND j.role IS NULL AND j.kind = ANY (p_kinds)
               AND (j.priority, j.run_at, j.id) > (p_after_priority, p_after_run_at, p_after_id)
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
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END, j.priority, j.run_at;
    ELSIF p_role IS NULL THEN
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
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END, j.priority, j.run_at;
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
                  CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END, j.priority, j.run_at;
    END IF;
END;
$$;
