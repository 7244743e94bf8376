-- Each limit of each queue with limits (forge.queue_limits), and whether it is reached now:
-- 'global' when as many attempts claimed under it run as it allows, 'rate' when some rate
-- key's window holds as many claims as it allows. For the metrics_aggregator leader's
-- forge_job_queue_limited gauge (which counts it only while the queue has available jobs).
CREATE OR REPLACE FUNCTION forge.queue_limits_reached(p_namespace text)
RETURNS TABLE (queue text, limit_kind text, reached boolean)
LANGUAGE sql STABLE
AS $$
    SELECT l.queue, 'global',
           (SELECT count(*) FROM forge.queue_slots s
              JOIN forge.jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                               AND j.state = 'running'
             WHERE s.namespace = l.namespace AND s.queue = l.queue) >= l.global_concurrency
      FROM forge.queue_limits l
     WHERE l.namespace = p_namespace AND l.global_concurrency IS NOT NULL
    UNION ALL
    SELECT l.queue, 'rate',
           EXISTS (SELECT 1 FROM forge.queue_claims c
                    WHERE c.namespace = l.namespace AND c.queue = l.queue
                      AND c.claimed_at > clock_timestamp()
                                         - l.rate_window_ms * interval '1 millisecond'
                    GROUP BY c.rate_key HAVING count(*) >= l.rate_count)
      FROM forge.queue_limits l
     WHERE l.namespace = p_namespace AND l.rate_count IS NOT NULL;
$$;
