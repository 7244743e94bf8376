-- KX: K (k_claim.sql, applied first) with the exclusion list as a literal: PostgreSQL 15 hashes a
-- NOT IN list of constants, not one of parameters (the claim's statement is planned per call).
CREATE OR REPLACE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_named  bigint[];
    v_ids    bigint[];
    v_atts   integer[];
    v_keep   boolean[];
BEGIN
    SELECT coalesce(array_agg(r), '{}') INTO v_named
      FROM exp.lanes l CROSS JOIN LATERAL unnest(l.running) AS r WHERE l.queue = 'default';
    -- (A literal array: PostgreSQL 15 hashes a NOT IN list of constants, not of parameters.)
    EXECUTE format($q$
    SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.attempt ORDER BY c.priority, c.run_at, c.id) FROM (
        SELECT c.id, c.attempt, c.priority, c.run_at FROM forge.jobs_live c
         WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
           AND c.role IS NULL AND c.kind = ANY (ARRAY['noop']) AND c.id <> ALL (%L::bigint[])
         ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED) c$q$, v_named)
      INTO v_ids, v_atts;
    -- The second look: a lane that named one of them since this claim's snapshot.
    SELECT array_agg(NOT EXISTS (SELECT 1 FROM exp.lanes l
                                  WHERE l.queue = 'default' AND l.lane <> 'writes'
                                    AND x.id = ANY (l.running)))
      INTO v_keep FROM unnest(v_ids) AS x(id);
    UPDATE exp.lanes l SET running = coalesce(v_ids, '{}'), claimed_at = clock_timestamp()
     WHERE l.lane = 'writes';
    RETURN QUERY SELECT x.id, x.att + 1 FROM unnest(v_ids, v_atts, v_keep) AS x(id, att, keep)
                  WHERE x.keep;
END $$;
