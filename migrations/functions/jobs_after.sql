-- Makes a job just enqueued (in this transaction: no worker can have claimed it) wait for its
-- parents (NewJob::after). Called by the enqueueing statement for each row it inserted.
--
-- The parents are locked (in id order, as forge.jobs_parent_finished locks children), so a
-- parent finishing at the same moment is counted either here (it is finished when the lock is
-- granted) or by the writer that ends it (which reads has_children from the row version it
-- ends, written after this commits, and then finds the edge), never both and never neither.
-- A parent that already completed counts as done; one that ended dead or cancelled applies the
-- child's policy at once (cancel it, or count it as done with p_run_anyway). An id that names
-- no job of this namespace is refused (FG003): a job deleted by retention cannot be told from
-- one that never existed, so a child must be enqueued while its parents' rows exist. Returns
-- the child's state.
CREATE OR REPLACE FUNCTION forge.jobs_after(
    p_child     bigint,
    p_inserted  boolean,
    p_parents   jsonb,
    p_run_anyway boolean
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_ns       text;
    v_state    text;
    v_parents  bigint[];
    v_found    bigint[];
    v_open     bigint[];
    v_failed   text;
BEGIN
    IF NOT p_inserted OR p_parents IS NULL OR jsonb_array_length(p_parents) = 0 THEN
        RETURN NULL;
    END IF;
    SELECT j.namespace, j.state INTO v_ns, v_state FROM forge.jobs j WHERE j.id = p_child;
    v_parents := ARRAY(SELECT DISTINCT x::bigint FROM jsonb_array_elements_text(p_parents) x
                        ORDER BY 1);
    WITH p AS (
        SELECT j.id, j.state FROM forge.jobs j
         WHERE j.id = ANY (v_parents) AND j.namespace = v_ns
         ORDER BY j.id FOR NO KEY UPDATE
    )
    SELECT array_agg(p.id),
           array_agg(p.id) FILTER (WHERE p.state NOT IN ('completed', 'dead', 'cancelled')),
           min(format('%s is %s', p.id, p.state)) FILTER (WHERE p.state IN ('dead', 'cancelled'))
      INTO v_found, v_open, v_failed
      FROM p;
    IF coalesce(cardinality(v_found), 0) < cardinality(v_parents) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'FG003',
            MESSAGE = format('job %s cannot wait for job(s) %s: no such job in this cluster',
                             p_child, array_to_string(ARRAY(
                                 SELECT x FROM unnest(v_parents) x
                                  WHERE x <> ALL (coalesce(v_found, '{}'))), ', ')),
            HINT = 'a parent must exist when its child is enqueued (finished jobs are deleted after [jobs] completed_retention / dead_retention; enqueue the child first, or in the parent''s transaction)';
    END IF;
    INSERT INTO forge.job_edges (parent_id, child_id, resolved)
    SELECT x, p_child, x <> ALL (coalesce(v_open, '{}')) FROM unnest(v_parents) x;
    UPDATE forge.jobs j SET has_children = true
     WHERE j.id = ANY (v_open) AND NOT j.has_children;
    IF v_failed IS NOT NULL AND NOT p_run_anyway THEN
        UPDATE forge.jobs j
           SET state = 'cancelled', finished_at = clock_timestamp(), parents = v_parents,
               parents_left = 0, on_parent_failure = 'cancel',
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'reason', 'cancelled',
                   'error', format('cancelled before it ran: its parent job %s', v_failed)))
         WHERE j.id = p_child
        RETURNING j.state INTO v_state;
        RETURN v_state;
    END IF;
    UPDATE forge.jobs j
       SET parents = v_parents,
           parents_left = coalesce(cardinality(v_open), 0),
           on_parent_failure = CASE WHEN p_run_anyway THEN 'run' ELSE 'cancel' END,
           state = CASE WHEN cardinality(v_open) > 0 THEN 'pending' ELSE j.state END
     WHERE j.id = p_child
    RETURNING j.state INTO v_state;
    RETURN v_state;
END;
$$;
