-- The scheduler leader's pass, fenced by its tenure: rescue the running jobs of nodes that
-- are down or stopped (membership says so, with evidence: see forge.nodes_watch) and of role
-- leaderships that ended, and promote due jobs. (Finished jobs are pruned by the log
-- compactor, queue figures sampled by the metrics aggregator.) Rows:
--   ('rescued', queue, kind, new state, n)   jobs taken back
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

    SELECT * INTO v_promote FROM forge.jobs_promote(p_namespace, p_limit);
    RETURN QUERY SELECT 'next_due', NULL::text, NULL::text, NULL::text, v_promote.next_due_in_ms,
                        v_promote.server_now;
END;
$$;
