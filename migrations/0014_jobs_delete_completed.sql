-- FORGE jobs: completed jobs deleted at completion, when they are not kept.
--
-- With [jobs] completed_retention = "0s" a node asks for completed jobs not to be kept: the
-- statement that records a completion deletes the job's row instead of writing a 'completed'
-- version of it, as graphile_worker does. Each completion then costs the row's deletion mark
-- instead of a new row version and two index entries (jobs_pkey and jobs_finished), and the
-- hot table holds only unfinished jobs.
--
-- The guard is the same as for an update (this attempt, this node, still running), so a job
-- is still never completed twice and a rescued job's late outcome is still refused while the
-- job exists. What deleting changes: when a repeated report (its first reply was lost) or a
-- handler's own transactional completion already deleted the row, the report finds no row and
-- counts as recorded. A row that is gone for another reason - rescued, then completed and
-- deleted by another node - counts as recorded too (its outcome is not refused in this node's
-- metrics); the job itself finished once either way.
--
-- Both functions take one more parameter, p_keep_completed; the earlier signatures stay for
-- nodes of earlier builds (which keep completed jobs).
--
-- Rows found first, then written by ctid. Every write of jobs_step used to join the rows it
-- writes (the reported ids, the claimed ids) back to forge.jobs, and the planner chose how:
-- with the statistics of a table whose jobs were all queued when it was last analyzed
-- (node_id all NULL), it expected one row of this node's, and for a table of 20,000 rows it
-- scanned the whole table for each claim (hash join) and looped over all reported ids for each
-- running job (55-74 ms for one round trip of 500 jobs, against 4-8 ms once autovacuum had
-- analyzed again). Now the guarded rows are looked up one by one by primary key (a LATERAL
-- subquery with LIMIT 1 is never flattened into a join; OFFSET 0 keeps 'running' a column, so
-- the partial index jobs_running is never used for it: see 0012), and the claim's rows come
-- from its SELECT ... FOR UPDATE SKIP LOCKED; each is then written through `ctid = ANY (...)`,
-- a TID scan, whatever the statistics. A row found and not yet written cannot change meanwhile:
-- the claim's and the reports' lookups lock their rows (a lookup that waits for another writer
-- checks the guard again on the version it then locks). The write by ctid alone would rely on
-- the TID scan checking its TID list again on a newer version, which PostgreSQL's sources have
-- not always done (TidRecheck returned true); 15.18 does. Marking jobs started locks nothing;
-- its update repeats its conditions instead, which are all it needs. Side by side on one server, 20,000
-- no-op jobs, one node: 44,000-51,000 jobs/s before, 57,000 after (pg_stat_statements on).

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
    p_default_max_attempts integer,
    p_after_priority smallint,
    p_after_run_at   timestamptz,
    p_after_id       bigint,
    p_keep_completed boolean
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
    v_tids    tid[];
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);

    IF cardinality(p_started) > 0 THEN
        -- (Rows found by primary key, then written by ctid: see this file's header.)
        SELECT array_agg(x.tid) INTO v_tids
          FROM (SELECT s.id, 'running'::text AS running FROM unnest(p_started) AS s(id)
                OFFSET 0) s
         CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs j
                              WHERE j.id = s.id AND j.node_id = p_node AND j.state = s.running
                                AND j.started_at IS NULL LIMIT 1) x;
        -- (Not locked: a version written meanwhile is checked again by these conditions.)
        UPDATE forge.jobs j SET started_at = clock_timestamp()
         WHERE j.ctid = ANY (v_tids) AND j.node_id = p_node AND j.state = 'running'
           AND j.started_at IS NULL;
    END IF;

    IF cardinality(p_ids) > 0 AND p_states <@ ARRAY['completed'] THEN
        -- Only completions: the guarded rows, then one update or one delete of them.
        SELECT array_agg(x.tid) INTO v_tids
          FROM (SELECT o.id, o.attempt, 'running'::text AS running
                  FROM unnest(p_ids, p_attempts) AS o(id, attempt) OFFSET 0) o
         CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs j
                              WHERE j.id = o.id AND j.attempt = o.attempt AND j.node_id = p_node
                                AND j.state = o.running LIMIT 1 FOR NO KEY UPDATE) x;
        IF p_keep_completed THEN
            UPDATE forge.jobs j
               SET state = 'completed', finished_at = clock_timestamp()
             WHERE j.ctid = ANY (v_tids);
        ELSE
            DELETE FROM forge.jobs j WHERE j.ctid = ANY (v_tids);
        END IF;
        GET DIAGNOSTICS v_applied = ROW_COUNT;
        IF v_applied < cardinality(p_ids) THEN
            -- Not all were recorded: report the ones taken away from this node (a job its
            -- handler completed in its own transaction counts as recorded; when completed
            -- jobs are deleted, so does a job that is gone).
            RETURN QUERY
            SELECT o.id, false, NULL::text, NULL::jsonb, NULL::integer, NULL::integer,
                   NULL::bigint, NULL::double precision, 'refused'::text, NULL::smallint,
                   NULL::timestamptz
              FROM unnest(p_ids, p_attempts) AS o(id, attempt)
             WHERE NOT EXISTS (SELECT 1 FROM forge.jobs j
                                WHERE j.id = o.id AND j.state = 'completed'
                                  AND j.attempt = o.attempt AND j.node_id = p_node)
               AND (p_keep_completed OR EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = o.id));
        END IF;
    ELSIF cardinality(p_ids) > 0 THEN
        -- The reported jobs still running this attempt here (the guard), with their rows.
        WITH o AS MATERIALIZED (
            SELECT o.*, x.tid
              FROM (SELECT o.*, 'running'::text AS running
                      FROM unnest(p_ids, p_attempts, p_states, p_delays_ms, p_errors)
                           AS o(id, attempt, state, delay_ms, error) OFFSET 0) o
             CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs j
                                  WHERE j.id = o.id AND j.attempt = o.attempt
                                    AND j.node_id = p_node AND j.state = o.running
                                  LIMIT 1 FOR NO KEY UPDATE) x
        ), d AS (
            -- Completed jobs are deleted when they are not kept.
            DELETE FROM forge.jobs j
             USING o
             WHERE NOT p_keep_completed AND o.state = 'completed'
               AND j.ctid = ANY (ARRAY(SELECT o.tid FROM o)) AND j.ctid = o.tid
            RETURNING j.id, 'completed'::text AS state, j.run_at, j.queue, j.role
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
             WHERE (p_keep_completed OR o.state <> 'completed')
               AND j.ctid = ANY (ARRAY(SELECT o.tid FROM o)) AND j.ctid = o.tid
            RETURNING j.id, j.state, j.run_at, j.queue, j.role
        ), a AS (
            SELECT * FROM u UNION ALL SELECT * FROM d
        )
        SELECT array_agg(a.id), array_agg(a.state),
               min(a.run_at) FILTER (WHERE a.state = 'retryable'),
               array_agg(DISTINCT CASE WHEN a.role IS NULL THEN a.queue ELSE '@' || a.role END)
                   FILTER (WHERE a.state = 'available')
          INTO v_ids, v_states, v_due, v_wake
          FROM a;
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
                             SELECT 1 FROM forge.jobs j
                              WHERE j.id = o.id AND j.state = 'completed'
                                AND j.attempt = o.attempt AND j.node_id = p_node)
                             OR (NOT p_keep_completed
                                 AND NOT EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = o.id))))
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
        SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
          FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs j
                 WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.state = 'available'
                   AND j.role IS NULL AND j.kind = ANY (p_kinds)
                   AND (j.priority, j.run_at, j.id) > (p_after_priority, p_after_run_at, p_after_id)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED) c;
    ELSIF p_role IS NULL THEN
        SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
          FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs j
                 WHERE j.namespace = p_namespace AND j.queue = p_queue AND j.state = 'available'
                   AND j.role IS NULL AND j.kind = ANY (p_kinds)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED) c;
    ELSE
        SELECT array_agg(c.tid ORDER BY c.priority, c.run_at, c.id) INTO v_tids
          FROM (SELECT j.ctid AS tid, j.id, j.priority, j.run_at FROM forge.jobs j
                 WHERE j.namespace = p_namespace AND j.role = p_role
                   AND (p_queue IS NULL OR j.queue = p_queue)
                   AND NOT EXISTS (SELECT 1 FROM forge.queues q
                                    WHERE q.namespace = p_namespace AND q.queue = j.queue)
                   AND j.state = 'available' AND j.kind = ANY (p_kinds)
                 ORDER BY j.priority, j.run_at, j.id
                 LIMIT p_limit
                   FOR UPDATE SKIP LOCKED) c;
    END IF;
    -- The claimed rows, locked above, by ctid: the first p_start of the claim order start now.
    RETURN QUERY
    UPDATE forge.jobs j
       SET state = 'running', attempt = j.attempt + 1, node_id = p_node,
           epoch = CASE WHEN p_role IS NOT NULL THEN p_epoch END,
           tenure = CASE WHEN p_role IS NOT NULL THEN p_tenure END,
           attempted_at = clock_timestamp(),
           started_at = CASE WHEN j.ctid = ANY (v_tids[1:p_start]) THEN clock_timestamp() END
     WHERE j.ctid = ANY (v_tids)
    RETURNING j.id, true, j.kind, j.args, j.attempt, j.max_attempts, j.timeout_ms,
              extract(epoch FROM j.attempted_at - j.run_at)::double precision * 1000,
              CASE WHEN j.started_at IS NULL THEN 'ahead' ELSE j.state END, j.priority, j.run_at;
END;
$$;

-- forge.jobs_complete (0005) with p_keep_completed: deletes the job instead of marking it
-- completed when completed jobs are not kept. In the same transaction a second call finds the
-- row gone and the transaction's mark set, and succeeds; in a later transaction it fails.
CREATE FUNCTION forge.jobs_complete(
    p_id        bigint,
    p_attempt   integer,
    p_node      text,
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_keep_completed boolean
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
    IF p_keep_completed THEN
        UPDATE forge.jobs j
           SET state = 'completed', finished_at = clock_timestamp()
         WHERE j.id = p_id AND j.attempt = p_attempt AND j.node_id = p_node
           AND j.state = 'running';
    ELSE
        DELETE FROM forge.jobs j
         WHERE j.id = p_id AND j.attempt = p_attempt AND j.node_id = p_node
           AND j.state = 'running';
    END IF;
    IF FOUND THEN
        PERFORM forge.tx_mark(v_mark);
        RETURN;
    END IF;
    SELECT j.state, j.node_id, j.attempt INTO v_state, v_node, v_attempt
      FROM forge.jobs j WHERE j.id = p_id;
    -- Completed already counts only when this transaction completed it (see tick_complete).
    IF forge.tx_marked(v_mark)
       AND ((v_state = 'completed' AND v_node = p_node AND v_attempt = p_attempt)
            OR (v_state IS NULL AND NOT p_keep_completed)) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'FG002',
        MESSAGE = format('job %s is no longer running attempt %s on node %s', p_id, p_attempt, p_node),
        DETAIL = CASE WHEN v_state IS NULL AND NOT p_keep_completed
                          THEN 'the job no longer exists (completed jobs are deleted when [jobs] completed_retention is 0s)'
                      WHEN v_state IS NULL THEN 'the job no longer exists'
                      ELSE format('it is %s (attempt %s, node %s)', v_state, v_attempt, v_node) END;
END;
$$;
