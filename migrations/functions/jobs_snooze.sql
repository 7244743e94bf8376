-- Snoozes a running attempt (JobError::snooze): the job waits p_delay_ms, scheduled, and the
-- attempt does not count (attempt numbers never go back, so max_attempts grows by one, as for
-- a released attempt). The snooze is recorded in the job's errors (reason 'snoozed'); those
-- entries are the count: once there are p_max_snoozes of them, nothing is written and the
-- answer is 'too_many_snoozes', and the worker dead-letters the job through its usual outcome
-- (so it counts as other dead jobs do). A cancel requested meanwhile cancels the job.
--
-- Guarded like every outcome: only if the job is still running this attempt on this node (a
-- role's job likewise: a deposed leader's late snooze changes nothing once the job was
-- rescued). So it is idempotent: a second call for the same attempt - after a reply that was
-- lost - finds the job no longer running and changes nothing. It is called in its own
-- transaction by the attempt's task, before the attempt ends; the worker then reports no
-- outcome for it. Returns the state recorded, or NULL when nothing was (not this attempt's).
CREATE OR REPLACE FUNCTION forge.jobs_snooze(
    p_namespace            text,
    p_id                   bigint,
    p_attempt              integer,
    p_node                 text,
    p_delay_ms             bigint,
    p_max_snoozes          integer,
    p_default_max_attempts integer,
    p_message              text
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_too_many boolean;
    v_state    text;
    v_run_at   timestamptz := clock_timestamp() + greatest(p_delay_ms, 0) * interval '1 millisecond';
    v_lane     text;
BEGIN
    PERFORM set_config('synchronous_commit', 'on', true);
    SELECT count(*) >= p_max_snoozes INTO v_too_many
      FROM forge.jobs j, jsonb_array_elements(j.errors) AS e
     WHERE j.id = p_id AND e->>'reason' = 'snoozed';
    IF v_too_many THEN
        RETURN 'too_many_snoozes';
    END IF;
    UPDATE forge.jobs j
       SET state = CASE WHEN j.cancel_requested THEN 'cancelled'
                        WHEN p_delay_ms <= 0 THEN 'available'
                        ELSE 'scheduled' END,
           run_at = CASE WHEN j.cancel_requested THEN j.run_at ELSE v_run_at END,
           max_attempts = CASE WHEN j.cancel_requested THEN j.max_attempts
                               ELSE coalesce(j.max_attempts, p_default_max_attempts) + 1 END,
           finished_at = CASE WHEN j.cancel_requested THEN clock_timestamp() END,
           errors = j.errors || jsonb_build_array(jsonb_build_object(
               'at', clock_timestamp(), 'attempt', j.attempt, 'node', p_node,
               'reason', 'snoozed', 'error', p_message))
     WHERE j.id = p_id AND j.namespace = p_namespace AND j.attempt = p_attempt
       AND j.node_id = p_node AND j.state = 'running'
    RETURNING j.state, CASE WHEN j.role IS NULL THEN j.queue ELSE '@' || j.role END
      INTO v_state, v_lane;
    IF v_state = 'scheduled' THEN
        PERFORM pg_notify('forge_jobs_due',
                          p_namespace || ' ' || (extract(epoch FROM v_run_at) * 1000)::bigint);
    ELSIF v_state = 'available' THEN
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || v_lane);
    END IF;
    RETURN v_state;
END;
$$;
