-- The trigger that decides a child's readiness, in the transaction that records its parent's
-- end: no polling, no leader, exact under failover (whoever commits the parent's end commits
-- its children's readiness with it). It fires only for rows that have children, or parents on
-- delete (the triggers' WHEN clauses), so jobs without dependencies cost one test per row.
--
-- * A parent ends (UPDATE to completed, dead or cancelled; its row moved to forge.jobs_done,
--   completed and kept; or its row is deleted: completed
--   with [jobs] completed_retention = "0s", pruned by retention, or deleted by an operator).
--   Its unresolved edges are marked resolved (once: a parent retried and finished again counts
--   nothing more), then its pending children are locked in id order and updated in one
--   statement: parents_left - 1; at 0 the child becomes available (scheduled if its run-at is
--   still ahead). A parent that completed, or whose row was deleted after it completed or
--   while it ran (the completion deleted it), counts as done; one that ended dead or
--   cancelled, or was deleted before it finished, cancels a child whose policy is 'cancel'
--   (which, if it has children, cascades through this trigger) and counts as done for a child
--   whose policy is 'run'.
-- * Two parents ending at once in two transactions: the second UPDATE waits for the child's
--   row lock and re-reads parents_left after the first commits (READ COMMITTED), so exactly
--   one of them sees the last parent end.
-- * A deleted row's edges are deleted with it (as parent or as child).
CREATE OR REPLACE FUNCTION forge.jobs_parent_finished() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_row      forge.jobs%ROWTYPE;
    v_ok       boolean;
    v_end      text;
    v_children bigint[];
    v_wake     text[];
    v_due      timestamptz;
    v_moved    boolean := false;
BEGIN
    -- (The update's trigger is called for every state written to a row with children: a
    -- WHEN that named the ended states cost each claim's statement more, read at each
    -- statement, than this test costs the few rows with children.)
    IF TG_OP = 'UPDATE' AND NEW.state NOT IN ('completed', 'dead', 'cancelled') THEN
        RETURN NULL;
    END IF;
    -- A row that left one partition of forge.jobs for the other: a completion kept
    -- (forge.jobs_move_done, or an update to 'completed') or a completed job made available
    -- again (forge.jobs_retry_now). The first is the parent's end, and its edges stay; the
    -- second ends nothing.
    IF TG_OP = 'DELETE' AND OLD.state = 'completed' THEN
        v_moved := EXISTS (SELECT 1 FROM forge.jobs_live j WHERE j.id = OLD.id);
        IF v_moved THEN
            RETURN NULL;
        END IF;
    ELSIF TG_OP = 'DELETE' THEN
        v_moved := EXISTS (SELECT 1 FROM forge.jobs_done j WHERE j.id = OLD.id);
    END IF;
    IF v_moved THEN
        v_row := OLD;
        v_ok := true;
        v_end := 'completed';
    ELSIF TG_OP = 'DELETE' THEN
        v_row := OLD;
        v_ok := OLD.state IN ('running', 'completed');
        v_end := CASE WHEN OLD.state IN ('dead', 'cancelled') THEN OLD.state
                      ELSE 'deleted before it finished' END;
    ELSE
        v_row := NEW;
        v_ok := NEW.state = 'completed';
        v_end := NEW.state;
    END IF;
    IF v_row.has_children THEN
        WITH e AS (
            UPDATE forge.job_edges e SET resolved = true
             WHERE e.parent_id = v_row.id AND NOT e.resolved
            RETURNING e.child_id
        )
        SELECT array_agg(e.child_id ORDER BY e.child_id) INTO v_children FROM e;
    END IF;
    IF v_children IS NOT NULL THEN
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
                                           v_row.id, v_end)))
                       ELSE c.errors END
             WHERE c.id = ANY (v_children) AND c.state = 'pending'
            RETURNING c.state, c.queue, c.role, c.run_at
        )
        SELECT array_agg(DISTINCT CASE WHEN c.role IS NULL THEN c.queue ELSE '@' || c.role END)
                   FILTER (WHERE c.state = 'available'),
               min(c.run_at) FILTER (WHERE c.state = 'scheduled')
          INTO v_wake, v_due
          FROM c;
        PERFORM pg_notify('forge_jobs', v_row.namespace || ' ' || w) FROM unnest(v_wake) AS w;
        IF v_due IS NOT NULL THEN
            PERFORM pg_notify('forge_jobs_due',
                              v_row.namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
        END IF;
    END IF;
    IF TG_OP = 'DELETE' AND NOT v_moved THEN
        DELETE FROM forge.job_edges e WHERE e.parent_id = OLD.id OR e.child_id = OLD.id;
    END IF;
    RETURN NULL;
END;
$$;

-- The triggers. A function file applies whatever migrations the database has (it may be
-- applied before migration 0010 adds the columns they test), and migration 0010 cannot name
-- this function before it exists: so each creates them when the other's part is there -
-- here when the columns exist, in 0010 when this function does.
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('forge.jobs') AND attname = 'has_children'
                  AND NOT attisdropped) THEN
        DROP TRIGGER IF EXISTS jobs_parent_ended ON forge.jobs;
        CREATE TRIGGER jobs_parent_ended
            AFTER UPDATE OF state ON forge.jobs
            FOR EACH ROW
            WHEN (NEW.has_children)
            EXECUTE FUNCTION forge.jobs_parent_finished();
        DROP TRIGGER IF EXISTS jobs_linked_deleted ON forge.jobs;
        CREATE TRIGGER jobs_linked_deleted
            AFTER DELETE ON forge.jobs
            FOR EACH ROW
            WHEN (OLD.has_children OR OLD.parents IS NOT NULL)
            EXECUTE FUNCTION forge.jobs_parent_finished();
    END IF;
END
$do$;
