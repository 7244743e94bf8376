-- Whether the cluster knows a queue: a node works it (forge.nodes.queues), it holds an
-- unfinished or dead job, or it is paused. Operators' pause and resume refuse other names (a
-- typo would otherwise show as a paused queue): only an explicit "new" pre-pauses one. Each
-- branch reads a partial index of the phases it asks for (as forge.jobs_figures does), so the
-- cost follows the unfinished jobs, never the finished ones.
CREATE OR REPLACE FUNCTION forge.queue_known(p_namespace text, p_queue text)
RETURNS boolean
LANGUAGE sql STABLE
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
AS $$
    SELECT EXISTS (SELECT 1 FROM forge.queues q WHERE q.namespace = p_namespace AND q.queue = p_queue)
        OR EXISTS (SELECT 1 FROM forge.nodes n WHERE n.namespace = p_namespace AND n.queues ? p_queue)
        OR EXISTS (SELECT 1 FROM forge.jobs_live j
                    WHERE j.namespace = p_namespace AND j.queue = p_queue
                      AND j.phase = 'ready' AND j.role IS NULL)
        OR EXISTS (SELECT 1 FROM forge.jobs_live j
                    WHERE j.namespace = p_namespace AND j.queue = p_queue
                      AND j.phase = 'dead')
        OR EXISTS (SELECT 1 FROM forge.jobs_live j
                    WHERE j.namespace = p_namespace AND j.queue = p_queue
                      AND j.phase = 'ready' AND j.role IS NOT NULL)
        OR EXISTS (SELECT 1 FROM forge.jobs_live j
                    WHERE j.namespace = p_namespace AND j.queue = p_queue
                      AND j.phase IN ('scheduled', 'retryable'))
        OR EXISTS (SELECT 1 FROM forge.jobs_live j
                    WHERE j.namespace = p_namespace AND j.queue = p_queue
                      AND j.phase = 'busy');
$$;
