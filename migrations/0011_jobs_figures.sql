-- FORGE jobs: queue figures that do not read the history.
--
-- forge.jobs_figures (0005) counted unfinished and dead jobs with one `state IN (...)` filter,
-- which no index serves: PostgreSQL scanned the whole table, finished jobs included - 1.7 s
-- with 10 million completed jobs retained, every [jobs] maintenance_interval, on the
-- metrics_aggregator leader's lock session. Each branch below matches one partial index
-- (jobs_claim, jobs_claim_role, jobs_due, jobs_running, jobs_finished), so the cost follows
-- the jobs counted, not the jobs kept. Same columns and rows as before.

CREATE OR REPLACE FUNCTION forge.jobs_figures(p_namespace text)
RETURNS TABLE (queue text, kind text, state text, n bigint, oldest_age_s double precision)
LANGUAGE sql STABLE
AS $$
    SELECT f.queue, f.kind, f.state, sum(f.n)::bigint,
           extract(epoch FROM clock_timestamp() - min(f.oldest))::double precision
      FROM (
        SELECT j.queue, j.kind, j.state, count(*) AS n, min(j.run_at) AS oldest
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'available' AND j.role IS NULL
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'available' AND j.role IS NOT NULL
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state IN ('scheduled', 'retryable')
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'running'
         GROUP BY j.queue, j.kind, j.state
        UNION ALL
        -- Every dead job has finished_at (jobs_finished's predicate).
        SELECT j.queue, j.kind, j.state, count(*), min(j.run_at)
          FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.state = 'dead' AND j.finished_at IS NOT NULL
         GROUP BY j.queue, j.kind, j.state
      ) f
     GROUP BY f.queue, f.kind, f.state
$$;
