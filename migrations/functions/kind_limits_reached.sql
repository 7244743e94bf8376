-- Each limit of each job kind with limits (forge.kind_limits), and whether it is reached now:
-- 'global' when as many attempts claimed under it run as it allows, 'rate' when some rate
-- key's window holds as many claims as it allows. For the metrics_aggregator leader's
-- forge_job_kind_limited gauge (which counts it only while the kind has available jobs).
CREATE OR REPLACE FUNCTION forge.kind_limits_reached(p_namespace text)
RETURNS TABLE (kind text, limit_kind text, reached boolean)
LANGUAGE sql STABLE
AS $$
    SELECT l.kind, 'global',
           (SELECT count(*) FROM forge.kind_slots s
              JOIN forge.jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                               AND j.state = 'running'
             WHERE s.namespace = l.namespace AND s.kind = l.kind) >= l.global_concurrency
      FROM forge.kind_limits l
     WHERE l.namespace = p_namespace AND l.global_concurrency IS NOT NULL
    UNION ALL
    SELECT l.kind, 'rate',
           EXISTS (SELECT 1 FROM forge.kind_claims c
                    WHERE c.namespace = l.namespace AND c.kind = l.kind
                      AND c.claimed_at > clock_timestamp()
                                         - l.rate_window_ms * interval '1 millisecond'
                    GROUP BY c.rate_key HAVING count(*) >= l.rate_count)
      FROM forge.kind_limits l
     WHERE l.namespace = p_namespace AND l.rate_count IS NOT NULL;
$$;
