-- The metrics aggregator's queue figures (and `forge queues`): unfinished jobs by queue, kind
-- and state, with the age of the oldest due one, and dead jobs.
--
-- Each branch counts one state from its partial index alone (jobs_claim, jobs_claim_role,
-- jobs_due and jobs_dead carry what the branch returns), so PostgreSQL counts with index-only
-- scans, and the cost follows the jobs counted, not the jobs kept: with 1,000,000 queued and
-- 10,000,000 finished jobs about 0.25 s in one process, where one `state IN (...)` filter
-- scanned the whole table in three processes (1.3-1.5 s) and a drain beside it lost a third of
-- its throughput. The function forbids sequential scans (an index scan is always possible here:
-- this only keeps the planner from preferring the table when few pages are all-visible),
-- parallel workers (a background figure takes one core, not three) and JIT (compiling costs
-- more than it saves on a query that runs every few seconds).
--
-- The states of the available and dead branches are constants: a predicate column is not
-- returned by an index, so naming j.state there would send every row to the heap.
CREATE OR REPLACE FUNCTION forge.jobs_figures(p_namespace text)
RETURNS TABLE (queue text, kind text, state text, n bigint, oldest_age_s double precision)
LANGUAGE sql STABLE
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
    SELECT f.queue, f.kind, f.state, sum(f.n)::bigint,
           extract(epoch FROM clock_timestamp() - min(f.oldest))::double precision
      FROM (
        SELECT j.queue, j.kind, 'available'::text AS state, count(*) AS n, min(j.run_at) AS oldest
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'available' AND j.role IS NULL
         GROUP BY j.queue, j.kind
        UNION ALL
        SELECT j.queue, j.kind, 'available', count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'available' AND j.role IS NOT NULL
         GROUP BY j.queue, j.kind
        UNION ALL
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state IN ('scheduled', 'retryable')
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        -- Waiting for their parents (jobs_pending).
        SELECT j.queue, j.kind, 'pending', count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'pending'
         GROUP BY j.queue, j.kind
        UNION ALL
        -- At most the cluster's concurrency: read from the heap.
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'running'
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        SELECT j.queue, j.kind, 'dead', count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'dead'
         GROUP BY j.queue, j.kind
      ) f
     GROUP BY f.queue, f.kind, f.state
$$;
