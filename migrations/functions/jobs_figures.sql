-- The metrics aggregator's queue figures (and `forge queues`): unfinished jobs by queue, kind
-- and state, with the age of the oldest due one, and dead jobs.
--
-- The running jobs are read first (forge.jobs_running: the lanes' lists and jobs_busy, at most
-- the cluster's concurrency); those a claim left 'ready' (migration 0016) are kept out of the
-- available branches by their ids, which the claim indexes carry (still index-only scans).
--
-- Each branch counts one phase (migration 0016) from its partial index alone (jobs_claim,
-- jobs_claim_role, jobs_due and jobs_dead carry what the branch returns), so PostgreSQL counts
-- with index-only scans, and the cost follows the jobs counted, not the jobs kept: with
-- 1,000,000 queued and 10,000,000 finished jobs about 0.25 s in one process, where one
-- `state IN (...)` filter scanned the whole table in three processes (1.3-1.5 s) and a drain
-- beside it lost a third of its throughput. The function forbids sequential scans (an index scan is always possible here:
-- this only keeps the planner from preferring the table when few pages are all-visible),
-- parallel workers (a background figure takes one core, not three) and JIT (compiling costs
-- more than it saves on a query that runs every few seconds).
--
-- The states of the available and dead branches are constants: a predicate column is not
-- returned by an index, so naming j.phase there would send every row to the heap; and no
-- branch names j.state (in no index) but the running jobs' (read from the heap anyway). The
-- branches read forge.jobs_live: on forge.jobs, whose partitions go by state, a branch that
-- names only the phase would read forge.jobs_done too.
CREATE OR REPLACE FUNCTION forge.jobs_figures(p_namespace text)
RETURNS TABLE (queue text, kind text, state text, n bigint, oldest_age_s double precision)
LANGUAGE sql STABLE
SET enable_seqscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
    WITH r AS MATERIALIZED (SELECT j.id, j.queue, j.kind, j.state, j.run_at
                              FROM forge.jobs_running(p_namespace, NULL) j)
    SELECT f.queue, f.kind, f.state, sum(f.n)::bigint,
           extract(epoch FROM clock_timestamp() - min(f.oldest))::double precision
      FROM (
        SELECT j.queue, j.kind, 'available'::text AS state, count(*) AS n, min(j.run_at) AS oldest
          FROM forge.jobs_live j
         WHERE j.namespace = p_namespace AND j.phase = 'ready' AND j.role IS NULL
           AND j.id NOT IN (SELECT r.id FROM r)
         GROUP BY j.queue, j.kind
        UNION ALL
        SELECT j.queue, j.kind, 'available', count(*), min(j.run_at)
          FROM forge.jobs_live j
         WHERE j.namespace = p_namespace AND j.phase = 'ready' AND j.role IS NOT NULL
           AND j.id NOT IN (SELECT r.id FROM r)
         GROUP BY j.queue, j.kind
        UNION ALL
        SELECT j.queue, j.kind, j.phase, count(*), min(j.run_at)
          FROM forge.jobs_live j
         WHERE j.namespace = p_namespace AND j.phase IN ('scheduled', 'retryable')
         GROUP BY j.queue, j.kind, j.phase
        UNION ALL
        -- Waiting for their parents (jobs_pending).
        SELECT j.queue, j.kind, 'pending', count(*), min(j.run_at)
          FROM forge.jobs_live j
         WHERE j.namespace = p_namespace AND j.phase = 'pending'
         GROUP BY j.queue, j.kind
        UNION ALL
        -- At most the cluster's concurrency: read from the heap.
        SELECT r.queue, r.kind, r.state, count(*), min(r.run_at)
          FROM r
         GROUP BY r.queue, r.kind, r.state
        UNION ALL
        SELECT j.queue, j.kind, 'dead', count(*), min(j.run_at)
          FROM forge.jobs_live j
         WHERE j.namespace = p_namespace AND j.phase = 'dead'
         GROUP BY j.queue, j.kind
      ) f
     GROUP BY f.queue, f.kind, f.state
$$;
