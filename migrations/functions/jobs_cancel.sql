-- Cancels a job: a queued one (pending, available, scheduled, retryable) at once; a running one by
-- setting cancel_requested and notifying its node, which stops the handler and records
-- 'cancelled' (a handler that completes first wins). Returns 'cancelled_now', 'requested',
-- 'finished:<state>' for a job that had already finished, or 'not_found'.
CREATE OR REPLACE FUNCTION forge.jobs_cancel(p_id bigint) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
    v_node  text;
    v_ns    text;
    v_linked boolean;
BEGIN
    -- The job can move between the statements (claimed, finished); each statement sees the
    -- latest committed state, so a few rounds settle it.
    FOR i IN 1..5 LOOP
        UPDATE forge.jobs j
           SET state = 'cancelled', finished_at = clock_timestamp(),
               errors = j.errors || jsonb_build_array(jsonb_build_object(
                   'at', clock_timestamp(), 'attempt', j.attempt, 'reason', 'cancelled',
                   'error', 'cancelled before it ran'))
         WHERE j.id = p_id AND j.state IN ('pending', 'available', 'scheduled', 'retryable')
        RETURNING j.has_children INTO v_linked;
        IF FOUND THEN
            IF v_linked THEN
                -- Its children count its end (see forge.jobs_parent_finished).
                PERFORM forge.jobs_parent_finished(ARRAY[p_id], ARRAY['cancelled'], false);
            END IF;
            RETURN 'cancelled_now';
        END IF;
        UPDATE forge.jobs j SET cancel_requested = true
         WHERE j.id = p_id AND j.state = 'running'
        RETURNING j.node_id, j.namespace INTO v_node, v_ns;
        IF FOUND THEN
            PERFORM pg_notify('forge_jobs_cancel', v_ns || ' ' || v_node || ' ' || p_id);
            RETURN 'requested';
        END IF;
        SELECT j.state INTO v_state FROM forge.jobs j WHERE j.id = p_id;
        IF NOT FOUND THEN
            RETURN 'not_found';
        END IF;
        IF v_state IN ('completed', 'dead', 'cancelled') THEN
            RETURN 'finished:' || v_state;
        END IF;
    END LOOP;
    RETURN 'moving:' || v_state;
END;
$$;
