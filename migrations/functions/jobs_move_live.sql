-- Makes completed jobs of p_namespace available again now (an operator's retry: see
-- forge.jobs_retry_now), with room for one more attempt: each row of p_ids in forge.jobs_done
-- moves back to forge.jobs_live in one statement. Returns the rows moved. A column added to
-- forge.jobs is added here too, as in forge.jobs_move_done (tests/it/history.rs checks that
-- both keep them all).
--
-- A move written out, not an update that PostgreSQL would move to the other partition: a
-- transaction that waits for such a row (the compactor's prune, an operator's delete, another
-- retry) would then fail ("tuple to be locked was already moved to another partition"), where
-- after a delete it finds the row gone and goes on without it.
CREATE OR REPLACE FUNCTION forge.jobs_move_live(p_namespace text, p_ids bigint[])
RETURNS TABLE (id bigint, queue text, role text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH d AS (
        DELETE FROM forge.jobs_done j
         WHERE j.namespace = p_namespace AND j.id = ANY (p_ids)
        RETURNING j.*
    ), i AS (
        INSERT INTO forge.jobs_live
        SELECT d.id, d.namespace, d.queue, d.kind, d.args, 'available', d.priority,
               clock_timestamp(), d.attempt, greatest(d.max_attempts, d.attempt + 1),
               d.timeout_ms, d.role, d.epoch, d.unique_key, d.node_id, d.attempted_at, NULL,
               d.errors, false, d.created_at, d.tenure, d.started_at, d.unstarted_rescues,
               d.limited, d.output, d.parents, d.parents_left, d.on_parent_failure,
               d.has_children, d.kind_limited, 'ready'
          FROM d
        RETURNING jobs_live.id, jobs_live.queue, jobs_live.role
    )
    SELECT i.id, i.queue, i.role FROM i;
END;
$$;
