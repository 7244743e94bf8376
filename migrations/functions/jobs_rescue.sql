-- Gives running jobs back: retried at once (available), or dead when out of attempts, or
-- cancelled when a cancel was requested. Guarded by (id, attempt, state = running), so a job
-- that finished or was re-claimed meanwhile is left alone. An attempt that started counts.
--
-- An attempt whose start was never recorded (started_at NULL: claimed ahead, waiting for a slot,
-- or started by a node that died before the mark landed) does not count - max_attempts grows by
-- one - three times per job (unstarted_rescues); from the fourth such rescue on it counts, so that
-- a job whose handler kills its process at once (a stack overflow, an out-of-memory kill) ends
-- dead after max_attempts instead of killing nodes forever.
--
-- p_counted: whether each attempt may count; false for a claim whose handler never ran (a lost
-- reply, found by the worker's reconciliation), which never counts. p_skip_locked: a row
-- another transaction holds is left as it is and returned with state 'locked' (the caller
-- tries again later) instead of being waited for.
DROP FUNCTION IF EXISTS forge.jobs_rescue(bigint[], integer[], text[], integer);
CREATE OR REPLACE FUNCTION forge.jobs_rescue(
    p_ids                  bigint[],
    p_attempts             integer[],
    p_reasons              text[],
    p_counted              boolean[],
    p_default_max_attempts integer,
    p_skip_locked          boolean
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
    v_locked  bigint[];
    v_tids    tid[];
    v_reasons text[];
    v_counted boolean[];
    v_ended   bigint[];
    v_ends    text[];
BEGIN
    -- Lock the rows still running this attempt, in the order given (with p_skip_locked, the
    -- ones another transaction holds are noted instead), and keep each one's tid: the update
    -- below writes those versions by tid, one probe of the primary key per job in all.
    IF p_skip_locked THEN
        SELECT array_agg(x.tid) FILTER (WHERE x.tid IS NOT NULL),
               array_agg(l.reason) FILTER (WHERE x.tid IS NOT NULL),
               array_agg(l.counted) FILTER (WHERE x.tid IS NOT NULL),
               array_agg(l.id) FILTER (WHERE x.tid IS NULL)
          INTO v_tids, v_reasons, v_counted, v_locked
          FROM (SELECT l.*, 'running'::text AS running
                  FROM unnest(p_ids, p_attempts, p_reasons, p_counted) AS l(id, attempt, reason, counted)
                OFFSET 0) l
          LEFT JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs_live j
                              WHERE j.id = l.id AND j.attempt = l.attempt AND j.state = l.running
                              LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED) x ON true
         WHERE x.tid IS NOT NULL OR EXISTS (
               SELECT 1 FROM forge.jobs_live j
                WHERE j.id = l.id AND j.attempt = l.attempt AND j.state = 'running');
    ELSE
        SELECT array_agg(x.tid), array_agg(l.reason), array_agg(l.counted)
          INTO v_tids, v_reasons, v_counted
          FROM (SELECT l.*, 'running'::text AS running
                  FROM unnest(p_ids, p_attempts, p_reasons, p_counted) AS l(id, attempt, reason, counted)
                OFFSET 0) l
         CROSS JOIN LATERAL (SELECT j.ctid AS tid FROM forge.jobs_live j
                              WHERE j.id = l.id AND j.attempt = l.attempt AND j.state = l.running
                              LIMIT 1 FOR NO KEY UPDATE) x;
    END IF;
    -- (An attempt counts when l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >=
    -- 3): spelled out in each column, so that it reads the row version the update writes.)
    WITH r AS (
        UPDATE forge.jobs_live j
           SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                            WHEN l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >= 3)
                             AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts) THEN 'dead'
                            ELSE 'available' END,
               -- (The phase of that state, written here so that the trigger of
               -- forge.jobs_phase does not call its function for each row.)
               phase = CASE WHEN j.cancel_requested THEN 'cancelled'
                            WHEN l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >= 3)
                             AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts) THEN 'dead'
                            ELSE 'ready' END,
               max_attempts = CASE WHEN l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >= 3)
                                   THEN j.max_attempts
                                   ELSE coalesce(j.max_attempts, p_default_max_attempts) + 1 END,
               unstarted_rescues = j.unstarted_rescues
                                   + CASE WHEN l.counted AND j.started_at IS NULL THEN 1 ELSE 0 END,
               finished_at = CASE WHEN j.cancel_requested
                                    OR (l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >= 3)
                                        AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts))
                                  THEN clock_timestamp() END,
               run_at = CASE WHEN j.cancel_requested
                               OR (l.counted AND (j.started_at IS NOT NULL OR j.unstarted_rescues >= 3)
                                   AND j.attempt >= coalesce(j.max_attempts, p_default_max_attempts))
                             THEN j.run_at ELSE clock_timestamp() END,
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'node', j.node_id,
                   'reason', 'rescued',
                   'error', l.reason || CASE
                       WHEN NOT l.counted
                           THEN ' (its handler never ran; it does not count)'
                       WHEN j.started_at IS NOT NULL THEN ''
                       WHEN j.unstarted_rescues < 3
                           THEN ' (its start was not recorded: the attempt had not started, or its'
                                || ' node died before the mark landed; it does not count: '
                                || (j.unstarted_rescues + 1) || ' of 3 such rescues)'
                       ELSE ' (the node running it died ' || (j.unstarted_rescues + 1)
                            || ' times before the handler''s start was recorded; it counts)'
                       END))
          FROM unnest(v_tids, v_reasons, v_counted) AS l(tid, reason, counted)
         -- (`= ANY` makes it a TID scan: joined to l alone, PostgreSQL hashes the whole table.)
         WHERE j.ctid = ANY (v_tids) AND j.ctid = l.tid
        RETURNING j.id, j.queue, j.kind, j.state, j.role, j.namespace, j.has_children
    )
    SELECT array_agg(r.id), array_agg(r.queue), array_agg(r.kind), array_agg(r.state),
           array_agg(DISTINCT r.namespace || ' ' || CASE WHEN r.role IS NULL THEN r.queue ELSE '@' || r.role END)
               FILTER (WHERE r.state = 'available'),
           array_agg(r.id) FILTER (WHERE r.has_children AND r.state <> 'available'),
           array_agg(r.state) FILTER (WHERE r.has_children AND r.state <> 'available')
      INTO v_ids, v_queues, v_kinds, v_states, v_wake, v_ended, v_ends
      FROM r;
    IF v_ended IS NOT NULL THEN
        -- Parents that ended dead or cancelled: their children count it (see
        -- forge.jobs_parent_finished).
        PERFORM forge.jobs_parent_finished(v_ended, v_ends, false);
    END IF;
    PERFORM pg_notify('forge_jobs', w) FROM unnest(v_wake) AS w;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_queues, v_kinds, v_states)
                 UNION ALL
                 SELECT k, NULL::text, NULL::text, 'locked'::text FROM unnest(v_locked) AS k;
END;
$$;
