-- A worker's check of its own running jobs: at its start, after a failed round trip or a LISTEN
-- outage, when a claim was refused for a stale identity, and every 10 s even when nothing
-- failed. Jobs running on this node for this worker that the worker does not know (a claim
-- whose response was lost, an ended role tenure) are rescued; for the jobs it knows, it learns
-- which were cancelled ('cancel') or taken away from it ('gone'). Role workers (p_queue NULL:
-- all queues of the role) also rescue jobs of their role left running under another tenure,
-- on any node.
--
-- First it takes the worker's lane (forge.jobs_lane_take): no round trip of the worker is then
-- in flight on the server (each has committed, and is seen here, or was ended), and the lane's
-- generation advances, so that a claim that reaches the server only later takes nothing. The
-- new generation is answered in a row ('lane', generation): the worker's claims carry it. An
-- orphan (claimed here, not held by the worker: a reply never received) is given back without
-- counting the attempt; a job it could not lock is answered 'unsettled' (the worker reconciles
-- again shortly).
DROP FUNCTION IF EXISTS forge.jobs_reconcile(text, text, text, text, bigint, bigint[], integer[], integer);
DROP FUNCTION IF EXISTS forge.jobs_reconcile(text, text, text, text, bigint, bigint[], integer[], integer, integer);
CREATE OR REPLACE FUNCTION forge.jobs_reconcile(
    p_namespace            text,
    p_node                 text,
    p_queue                text,
    p_role                 text,
    p_tenure               bigint,
    p_incarnation          bigint,
    p_ids                  bigint[],
    p_attempts             integer[],
    p_default_max_attempts integer,
    p_wait_ms              integer
) RETURNS TABLE (id bigint, status text, generation bigint)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
    v_counted  boolean[];
    v_locked   bigint[];
    v_generation bigint;
BEGIN
    v_generation := forge.jobs_lane_take(p_namespace, p_node, coalesce(p_queue, '@' || p_role),
                                         p_incarnation, p_wait_ms);

    SELECT array_agg(j.id), array_agg(j.attempt),
           array_agg(CASE WHEN j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure
                          THEN 'orphaned: claimed by node ' || p_node || ' but not running there'
                          ELSE 'the leadership of role ' || j.role || ' at epoch ' || j.epoch || ' ended' END),
           array_agg(NOT (j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure))
      INTO v_ids, v_attempts, v_reasons, v_counted
      FROM forge.jobs_running(p_namespace, CASE WHEN p_role IS NULL THEN p_node END) j
     WHERE (p_queue IS NULL OR j.queue = p_queue) AND j.role IS NOT DISTINCT FROM p_role
       AND ((j.node_id = p_node AND NOT (j.id = ANY (p_ids)))
            OR (p_role IS NOT NULL AND j.tenure IS DISTINCT FROM p_tenure));
    IF v_ids IS NOT NULL THEN
        SELECT array_agg(r.id) FILTER (WHERE r.state = 'locked') INTO v_locked
          FROM forge.jobs_rescue(v_ids, v_attempts, v_reasons, v_counted,
                                 p_default_max_attempts, true) r;
    END IF;
    -- The lane's list (see forge.jobs_step), rebuilt while this holds the lane: its running jobs
    -- that are not busy, less the ended ones that the round trips left in it; and the orphans
    -- it could not lock, which the worker does not hold, so that the claims keep them listed.
    UPDATE forge.job_lanes l
       SET running = ARRAY(SELECT j.id FROM forge.jobs_running(p_namespace, p_node) j
                            WHERE j.phase = 'ready' AND j.role IS NOT DISTINCT FROM p_role
                              AND (p_queue IS NULL OR j.queue = p_queue)),
           unsettled = coalesce(v_locked, '{}')
     WHERE l.namespace = p_namespace AND l.node_id = p_node
       AND l.lane = coalesce(p_queue, '@' || p_role);

    RETURN QUERY
    SELECT k.id, CASE WHEN j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node
                           OR j.attempt <> k.attempt THEN 'gone'
                      ELSE 'cancel' END, NULL::bigint
      FROM unnest(p_ids, p_attempts) AS k(id, attempt)
      LEFT JOIN forge.jobs j ON j.id = k.id
     WHERE j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node OR j.attempt <> k.attempt
        OR j.cancel_requested
    UNION ALL
    SELECT u, 'unsettled', NULL::bigint FROM unnest(v_locked) AS u
    UNION ALL
    SELECT NULL::bigint, 'lane', v_generation;
END;
$$;
