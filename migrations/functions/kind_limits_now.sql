-- Where each limited kind among p_kinds stands now (forge.kind_limits; kinds without limits
-- have no row), for forge.jobs_step's claims: the room left under its global limit (NULL: it
-- has none), its rate, and the rate keys whose window is spent (a kind rated without a key
-- has one window, key ''), with wait_ms: when what is out of reach may come within it (the
-- first spent window's oldest claim leaving it; a second for a global limit reached, as an
-- outcome of the kind wakes the workers of its queue sooner). A global limit counts the kind's
-- slots whose job still runs that attempt (forge.kind_slots). Counted in statements that
-- begin when it is called (a volatile function: each sees what committed before), so under a
-- kind's limit lock it sees every claim that released the lock before.
CREATE OR REPLACE FUNCTION forge.kind_limits_now(p_namespace text, p_kinds text[])
RETURNS TABLE (kind text, room integer, rate_count integer, rate_key text, spent text[],
               wait_ms double precision)
LANGUAGE sql
AS $$
    SELECT l.kind, l.global_concurrency - r.running, l.rate_count, l.rate_key, w.spent,
           CASE WHEN l.global_concurrency - r.running <= 0 THEN 1000
                WHEN w.oldest IS NOT NULL
                    THEN greatest(extract(epoch FROM w.oldest
                                  + l.rate_window_ms * interval '1 millisecond'
                                  - clock_timestamp()) * 1000, 1) END
      FROM forge.kind_limits l
     CROSS JOIN LATERAL (SELECT count(*)::integer AS running FROM forge.kind_slots s
                           JOIN forge.jobs j ON j.id = s.job_id AND j.attempt = s.attempt
                                            AND j.state = 'running'
                          WHERE s.namespace = l.namespace AND s.kind = l.kind) r
     CROSS JOIN LATERAL (SELECT array_agg(k.rate_key) AS spent, min(k.oldest) AS oldest
                           FROM (SELECT c.rate_key, min(c.claimed_at) AS oldest
                                   FROM forge.kind_claims c
                                  WHERE c.namespace = l.namespace AND c.kind = l.kind
                                    AND c.claimed_at > clock_timestamp()
                                                       - l.rate_window_ms * interval '1 millisecond'
                                  GROUP BY c.rate_key
                                 HAVING count(*) >= l.rate_count) k) w
     WHERE l.namespace = p_namespace AND l.kind = ANY (p_kinds);
$$;
