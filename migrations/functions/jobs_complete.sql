-- Completes a job inside its handler's own transaction (River's JobCompleteTx): the handler's
-- writes and the job's completion commit together, or not at all. Guarded like every outcome
-- (this attempt, this node, still running); a role job is also fenced by its tenure. Raises
-- FG001 when fenced and FG002 when the job is no longer running this attempt on this node.
--
-- With p_keep_completed = false ([jobs] completed_retention = "0s") the job is deleted instead
-- of marked completed. The transaction is marked (forge.tx_mark), so in the same transaction a
-- second call finds the row gone (or completed) and the mark set, and succeeds; in a later
-- transaction it fails.
CREATE OR REPLACE FUNCTION forge.jobs_complete(
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
    v_done  boolean := false;
    v_linked boolean;
BEGIN
    IF p_role IS NOT NULL THEN
        PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);
    v_mark := format('job %s %s', p_id, p_attempt);
    IF p_keep_completed THEN
        -- (Kept completed jobs move to forge.jobs_done, the row found locked first.)
        SELECT true, m.has_children INTO v_done, v_linked
          FROM forge.jobs_move_done(ARRAY(
                    SELECT j.ctid FROM forge.jobs_live j
                     WHERE j.id = p_id AND j.attempt = p_attempt AND j.node_id = p_node
                       AND j.state = 'running'
                       FOR NO KEY UPDATE), NULL, p_node) m;
    ELSE
        DELETE FROM forge.jobs_live j
         WHERE j.id = p_id AND j.attempt = p_attempt AND j.node_id = p_node
           AND j.state = 'running'
        RETURNING true, j.has_children OR j.parents IS NOT NULL INTO v_done, v_linked;
    END IF;
    IF v_done THEN
        IF v_linked THEN
            -- Its children count its end (see forge.jobs_parent_finished).
            PERFORM forge.jobs_parent_finished(ARRAY[p_id], ARRAY['completed'],
                                               NOT p_keep_completed);
        END IF;
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
