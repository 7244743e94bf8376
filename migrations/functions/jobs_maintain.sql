-- The scheduler leader's pass, fenced by its tenure: rescue the running jobs of nodes that
-- are down or stopped (membership says so, with evidence: see forge.nodes_watch) and of role
-- leaderships that ended, count the ends of parent jobs that SQL outside FORGE wrote, and promote
-- due jobs. (Finished jobs are pruned by the log compactor, queue figures sampled by the metrics
-- aggregator.) Rows:
--   ('rescued', queue, kind, new state, n)   jobs taken back
--   ('settled', NULL, NULL, NULL, n)         parents whose end their children counted here
--   ('next_due', NULL, NULL, NULL, ms, at)   how long until the next scheduled job is due, and
--                                            the server's clock
--
-- Rescues skip rows another transaction holds (a frozen node's open transaction, until its
-- sessions are ended): ('deferred', n) says how many, and the leader passes again soon.
CREATE OR REPLACE FUNCTION forge.jobs_maintain(
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
    v_queues   text[];
    v_kinds    text[];
    v_states   text[];
    v_promote  record;
    v_ended    bigint[];
    v_ends     text[];
    v_gone     bigint[];
    v_lock_timeout text;
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
          FROM forge.jobs_running(p_namespace, NULL, p_maybe_lost => true) j
          LEFT JOIN forge.nodes nd ON nd.namespace = j.namespace AND nd.node_id = j.node_id
    )
    SELECT array_agg(lost.id), array_agg(lost.attempt), array_agg(lost.reason)
      INTO v_ids, v_attempts, v_reasons
      FROM lost WHERE lost.reason IS NOT NULL;
    IF v_ids IS NOT NULL THEN
        SELECT array_agg(r.queue), array_agg(r.kind), array_agg(r.state)
          INTO v_queues, v_kinds, v_states
          FROM forge.jobs_rescue(v_ids, v_attempts, v_reasons,
                                 array_fill(true, ARRAY[cardinality(v_ids)]),
                                 p_default_max_attempts, true) r;
        RETURN QUERY
        SELECT 'rescued', x.queue, x.kind, x.state, count(*)::double precision, NULL::timestamptz
          FROM unnest(v_queues, v_kinds, v_states) AS x(queue, kind, state)
         WHERE x.state <> 'locked'
         GROUP BY x.queue, x.kind, x.state;
        RETURN QUERY
        SELECT 'deferred', NULL::text, NULL::text, NULL::text, count(*)::double precision,
               NULL::timestamptz
          FROM unnest(v_states) AS x(state)
         WHERE x.state = 'locked'
        HAVING count(*) > 0;
    END IF;

    -- Parents whose end no writer counted in their children: FORGE's writers count it in the
    -- transaction that ends the parent (forge.jobs_parent_finished), an operator's UPDATE or
    -- DELETE does not. So: the parents of edges not counted yet that ended, locked (FOR SHARE:
    -- a retry cannot make one run again before its children counted it; one another
    -- transaction holds waits for the next pass), and those whose row is gone, counted as
    -- deleted before they finished (and their edges deleted). Counting them locks edges and
    -- children, which another transaction may hold (a frozen one): the pass waits 250 ms at
    -- most (lock_timeout, in a block whose failure undoes only the counting), then leaves
    -- them to the next pass, so that rescue and promotion never wait behind them.
    SELECT array_agg(p.id ORDER BY p.id), array_agg(p.state ORDER BY p.id) INTO v_ended, v_ends
      FROM (SELECT p.id, p.state FROM forge.jobs p
             WHERE p.id IN (SELECT e.parent_id FROM forge.job_edges e WHERE NOT e.resolved)
               AND p.namespace = p_namespace AND p.state IN ('completed', 'dead', 'cancelled')
               FOR SHARE SKIP LOCKED) p;
    SELECT array_agg(e.parent_id) INTO v_gone
      FROM (SELECT DISTINCT e.parent_id FROM forge.job_edges e WHERE NOT e.resolved) e
     WHERE NOT EXISTS (SELECT 1 FROM forge.jobs p WHERE p.id = e.parent_id);
    IF v_ended IS NOT NULL OR v_gone IS NOT NULL THEN
        v_lock_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '250ms', true);
            IF v_ended IS NOT NULL THEN
                PERFORM forge.jobs_parent_finished(v_ended, v_ends, false);
            END IF;
            IF v_gone IS NOT NULL THEN
                PERFORM forge.jobs_parent_finished(
                    v_gone,
                    array_fill('deleted before it finished'::text, ARRAY[cardinality(v_gone)]),
                    true);
            END IF;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            -- (The block's setting is undone with it.) Counted at the next pass.
            v_ended := NULL;
            v_gone := NULL;
        END;
    END IF;
    IF v_ended IS NOT NULL OR v_gone IS NOT NULL THEN
        RETURN QUERY SELECT 'settled', NULL::text, NULL::text, NULL::text,
                            (coalesce(cardinality(v_ended), 0)
                             + coalesce(cardinality(v_gone), 0))::double precision,
                            NULL::timestamptz;
    END IF;

    SELECT * INTO v_promote FROM forge.jobs_promote(p_namespace, p_limit);
    RETURN QUERY SELECT 'next_due', NULL::text, NULL::text, NULL::text, v_promote.next_due_in_ms,
                        v_promote.server_now;
END;
$$;
