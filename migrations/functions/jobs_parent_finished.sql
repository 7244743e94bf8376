-- Counts the end of parent jobs in their children, in the transaction that records the
-- parents' ends: no polling, no leader, exact under failover (whoever commits a parent's end
-- commits its children's readiness with it). Called by each of FORGE's writers that ends a
-- job or deletes a row, for the rows it wrote that have children (has_children; a deleted row
-- also when it has parents): forge.jobs_step's outcomes, forge.jobs_move_done's callers,
-- forge.jobs_complete, forge.jobs_rescue, forge.jobs_cancel, forge.jobs_prune,
-- forge.jobs_delete and the test kit's run_job. An end written by an operator's SQL is
-- counted by the scheduler leader's pass (forge.jobs_maintain), at most a maintenance interval
-- later.
--
-- Triggers did this until migration 0018: an AFTER row trigger fetches each row its statement
-- writes again, whatever its WHEN says, so every claim and every completion paid for the few
-- jobs with children (5.0 % of a drain's instructions per deleted job, 3.6 % per kept one).
--
-- p_ids: the parents (and, with p_deleted, the rows deleted); p_ends: how each ended -
-- 'completed' counts as done; 'dead', 'cancelled' or 'deleted before it finished' cancel a
-- child whose policy is 'cancel' (which, if it has children, cascades through this function)
-- and count as done for a child whose policy is 'run'.
--
-- * Each parent's unresolved edges are marked resolved (once: a parent retried and finished
--   again counts nothing more; two callers settling one parent at once - a writer and the
--   pass - count it once, the second finding the edges resolved when their lock is granted),
--   then its pending children are locked in id order and updated in one statement:
--   parents_left - 1; at 0 the child becomes available (scheduled if its run-at is still ahead).
-- * Two parents ending at once in two transactions: the second UPDATE waits for the child's
--   row lock and re-reads parents_left after the first commits (READ COMMITTED), so exactly
--   one of them sees the last parent end.
-- * p_deleted: the rows are gone; their edges (as parent or as child) are deleted.
DROP FUNCTION IF EXISTS forge.jobs_parent_finished() CASCADE;
CREATE OR REPLACE FUNCTION forge.jobs_parent_finished(
    p_ids     bigint[],
    p_ends    text[],
    p_deleted boolean
) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_parent    record;
    v_ok        boolean;
    v_children  bigint[];
    v_wake      text[];
    v_due       timestamptz;
    v_ns        text;
    v_cancelled bigint[];
BEGIN
    FOR v_parent IN SELECT p.id, p.how FROM unnest(p_ids, p_ends) AS p(id, how) ORDER BY p.id LOOP
        v_ok := v_parent.how = 'completed';
        WITH e AS (
            UPDATE forge.job_edges e SET resolved = true
             WHERE e.parent_id = v_parent.id AND NOT e.resolved
            RETURNING e.child_id
        )
        SELECT array_agg(e.child_id ORDER BY e.child_id) INTO v_children FROM e;
        CONTINUE WHEN v_children IS NULL;
        PERFORM 1 FROM forge.jobs c WHERE c.id = ANY (v_children) AND c.state = 'pending'
         ORDER BY c.id FOR NO KEY UPDATE;
        WITH c AS (
            UPDATE forge.jobs c
               SET parents_left = c.parents_left - 1,
                   state = CASE
                       WHEN NOT v_ok AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                       WHEN c.parents_left > 1 THEN 'pending'
                       WHEN c.run_at > clock_timestamp() THEN 'scheduled'
                       ELSE 'available' END,
                   run_at = CASE WHEN c.parents_left = 1 AND c.run_at < clock_timestamp()
                                 THEN clock_timestamp() ELSE c.run_at END,
                   finished_at = CASE WHEN NOT v_ok AND c.on_parent_failure = 'cancel'
                                      THEN clock_timestamp() END,
                   errors = CASE WHEN NOT v_ok AND c.on_parent_failure = 'cancel'
                       THEN c.errors || jsonb_build_array(jsonb_build_object(
                           'at', clock_timestamp(), 'attempt', c.attempt, 'reason', 'cancelled',
                           'error', format('cancelled before it ran: its parent job %s is %s',
                                           v_parent.id, v_parent.how)))
                       ELSE c.errors END
             WHERE c.id = ANY (v_children) AND c.state = 'pending'
            RETURNING c.id, c.namespace, c.state, c.queue, c.role, c.run_at, c.has_children
        )
        SELECT array_agg(DISTINCT c.namespace || ' '
                                  || CASE WHEN c.role IS NULL THEN c.queue ELSE '@' || c.role END)
                   FILTER (WHERE c.state = 'available'),
               min(c.run_at) FILTER (WHERE c.state = 'scheduled'),
               min(c.namespace),
               array_agg(c.id) FILTER (WHERE c.state = 'cancelled' AND c.has_children)
          INTO v_wake, v_due, v_ns, v_cancelled
          FROM c;
        PERFORM pg_notify('forge_jobs', w) FROM unnest(v_wake) AS w;
        IF v_due IS NOT NULL THEN
            PERFORM pg_notify('forge_jobs_due',
                              v_ns || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
        END IF;
        IF v_cancelled IS NOT NULL THEN
            -- The cascade: a cancelled child's own children.
            PERFORM forge.jobs_parent_finished(
                v_cancelled, array_fill('cancelled'::text, ARRAY[cardinality(v_cancelled)]), false);
        END IF;
    END LOOP;
    IF p_deleted THEN
        DELETE FROM forge.job_edges e WHERE e.parent_id = ANY (p_ids) OR e.child_id = ANY (p_ids);
    END IF;
END;
$$;
