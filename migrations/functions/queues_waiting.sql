-- The queues that have jobs waiting to be claimed by any node (available, no role), for the
-- cluster's status: a queue here that no live node works (forge.nodes.queues) has work with
-- nowhere to run. Role jobs run on their role's leader over every queue: the status judges them
-- by their role instead.
--
-- A loose index scan of jobs_claim: one descent per queue that has waiting jobs, to the first
-- of them, so the cost follows the number of such queues, not the number of jobs: with
-- 1,000,000 queued jobs in 3 queues, 0.26 ms and 14 buffers (a count of them: 133 ms). Each
-- descent steps over the index entries of jobs claimed since the last vacuum at the head of its
-- queue, as a claim from the head does: right after 666,667 jobs of two queues finished, the
-- first look took 367 ms, the next ones 47 and 19 ms (each marks what it stepped over dead).
CREATE OR REPLACE FUNCTION forge.queues_waiting(p_namespace text)
RETURNS SETOF text
LANGUAGE sql STABLE
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
    WITH RECURSIVE waiting(queue) AS (
        (SELECT j.queue FROM forge.jobs_live j
          WHERE j.namespace = p_namespace AND j.phase = 'ready' AND j.role IS NULL
          ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM forge.jobs_live j
                 WHERE j.namespace = p_namespace AND j.phase = 'ready' AND j.role IS NULL
                   AND j.queue > w.queue
                 ORDER BY j.queue LIMIT 1)
          FROM waiting w
         WHERE w.queue IS NOT NULL
    )
    SELECT queue FROM waiting WHERE queue IS NOT NULL
$$;
