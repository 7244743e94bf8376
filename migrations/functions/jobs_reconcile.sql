-- A worker's check of its own running jobs, after a failed round trip or a LISTEN outage:
-- jobs running on this node for this worker that the worker does not know (a claim whose
-- response was lost, an ended role tenure) are rescued; for the jobs it knows, it learns
-- which were cancelled ('cancel') or taken away from it ('gone'). Role workers (p_queue NULL:
-- all queues of the role) also rescue jobs of their role left running under another tenure,
-- on any node.
--
-- First it makes sure no round trip of the worker is still in flight on the server: every
-- round trip holds the worker's lane lock shared (forge.jobs_step); the reconciliation takes it
-- exclusively, waiting at most p_wait_ms at a time, and ends the sessions of round trips that
-- still hold it (ones the worker gave up on: a claim whose commit waits for a stalled
-- synchronous standby, say). Such a claim is thus settled - committed and seen, or ended -
-- before the look, instead of committing unseen after it and stranding its jobs on a live
-- node. An orphan (claimed here, not held by the worker: a reply never received) is given back
-- without counting the attempt; a job it could not lock is answered 'unsettled' (the worker
-- reconciles again shortly).
DROP FUNCTION IF EXISTS forge.jobs_reconcile(text, text, text, text, bigint, bigint[], integer[], integer);
CREATE OR REPLACE FUNCTION forge.jobs_reconcile(
    p_namespace            text,
    p_node                 text,
    p_queue                text,
    p_role                 text,
    p_tenure               bigint,
    p_ids                  bigint[],
    p_attempts             integer[],
    p_default_max_attempts integer,
    p_wait_ms              integer
) RETURNS TABLE (id bigint, status text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
    v_reasons  text[];
    v_counted  boolean[];
    v_locked   bigint[];
    v_lane     integer := hashtext(p_namespace || ' ' || p_node || ' ' || coalesce(p_queue, '@' || p_role));
    v_timeout  text := current_setting('lock_timeout');
    v_tries    integer := 0;
    v_stale    integer[];
BEGIN
    PERFORM set_config('lock_timeout', greatest(p_wait_ms, 1)::text, true);
    LOOP
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtext('forge.jobs_worker'), v_lane);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            v_tries := v_tries + 1;
            IF v_tries > 2 THEN
                RAISE;
            END IF;
            SELECT coalesce(array_agg(lk.pid), '{}') INTO v_stale FROM pg_locks lk
             WHERE lk.locktype = 'advisory' AND lk.objsubid = 2 AND lk.pid <> pg_backend_pid()
               AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
               AND lk.classid = hashtext('forge.jobs_worker')::oid AND lk.objid = v_lane::oid;
            PERFORM pg_terminate_backend(x, 1000) FROM unnest(v_stale) AS x;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_timeout, true);

    SELECT array_agg(j.id), array_agg(j.attempt),
           array_agg(CASE WHEN j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure
                          THEN 'orphaned: claimed by node ' || p_node || ' but not running there'
                          ELSE 'the leadership of role ' || j.role || ' at epoch ' || j.epoch || ' ended' END),
           array_agg(NOT (j.node_id = p_node AND j.tenure IS NOT DISTINCT FROM p_tenure))
      INTO v_ids, v_attempts, v_reasons, v_counted
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.state = 'running'
       AND (p_queue IS NULL OR j.queue = p_queue) AND j.role IS NOT DISTINCT FROM p_role
       AND ((j.node_id = p_node AND NOT (j.id = ANY (p_ids)))
            OR (p_role IS NOT NULL AND j.tenure IS DISTINCT FROM p_tenure));
    IF v_ids IS NOT NULL THEN
        SELECT array_agg(r.id) FILTER (WHERE r.state = 'locked') INTO v_locked
          FROM forge.jobs_rescue(v_ids, v_attempts, v_reasons, v_counted,
                                 p_default_max_attempts, true) r;
    END IF;

    RETURN QUERY
    SELECT k.id, CASE WHEN j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node
                           OR j.attempt <> k.attempt THEN 'gone'
                      ELSE 'cancel' END
      FROM unnest(p_ids, p_attempts) AS k(id, attempt)
      LEFT JOIN forge.jobs j ON j.id = k.id
     WHERE j.id IS NULL OR j.state <> 'running' OR j.node_id <> p_node OR j.attempt <> k.attempt
        OR j.cancel_requested
    UNION ALL
    SELECT u, 'unsettled' FROM unnest(v_locked) AS u;
END;
$$;
