-- Pauses or resumes a queue (forge.queues: no node claims a paused queue's jobs until it is
-- resumed), recorded in the audit trail. Resuming wakes the queue's workers and the role
-- workers with jobs waiting in it.
CREATE OR REPLACE FUNCTION forge.queue_set_paused(p_namespace text, p_queue text, p_paused boolean, p_by text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_paused THEN
        INSERT INTO forge.queues (namespace, queue, paused_at, paused_by)
        VALUES (p_namespace, p_queue, clock_timestamp(), p_by)
        ON CONFLICT (namespace, queue) DO UPDATE
           SET paused_at = coalesce(forge.queues.paused_at, EXCLUDED.paused_at),
               paused_by = coalesce(forge.queues.paused_by, EXCLUDED.paused_by);
    ELSE
        DELETE FROM forge.queues q WHERE q.namespace = p_namespace AND q.queue = p_queue;
        -- Wake the workers of the queue, and the role workers with jobs waiting in it.
        PERFORM pg_notify('forge_jobs', p_namespace || ' ' || p_queue);
        PERFORM pg_notify('forge_jobs', p_namespace || ' @' || r.role)
           FROM (SELECT DISTINCT j.role FROM forge.jobs_live j
                  WHERE j.namespace = p_namespace AND j.queue = p_queue
                    AND j.phase = 'ready' AND j.role IS NOT NULL) r;
    END IF;
    PERFORM forge.audit(p_namespace, CASE WHEN p_paused THEN 'pause_queue' ELSE 'resume_queue' END,
                        p_queue, p_by, '{}');
END;
$$;
