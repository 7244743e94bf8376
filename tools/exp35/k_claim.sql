-- K: the claim locks the rows it takes (FOR UPDATE SKIP LOCKED, as today's claim does before its
-- update) but writes no version of them: a running job stays 'available', and the lane's durable
-- row (exp.lanes, one HOT update per round trip) names it. No advisory lock: the lane row is the
-- claim. A claim skips the jobs any lane of the queue names, and looks again, in a statement of
-- its own (a fresh snapshot), at the lanes for the jobs it locked: a claim of another lane that
-- committed after this claim's snapshot released its row locks in the same commit that named
-- them, so the second look sees it. A completion deletes (or moves) the row guarded by its
-- state and attempt; attempts are counted at the outcome, or by the rescuer from the lane row.
CREATE TABLE exp.lanes (
    lane       text PRIMARY KEY,
    queue      text NOT NULL,
    running    bigint[] NOT NULL,
    claimed_at timestamptz NOT NULL
) WITH (fillfactor = 50);
CREATE INDEX ON exp.lanes (queue);
INSERT INTO exp.lanes VALUES ('writes', 'default', '{}', now());
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_named  bigint[];
    v_ids    bigint[];
    v_atts   integer[];
    v_keep   boolean[];
BEGIN
    SELECT coalesce(array_agg(r), '{}') INTO v_named
      FROM exp.lanes l CROSS JOIN LATERAL unnest(l.running) AS r WHERE l.queue = 'default';
    SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.attempt ORDER BY c.priority, c.run_at, c.id) INTO v_ids, v_atts FROM (
        SELECT c.id, c.attempt, c.priority, c.run_at FROM forge.jobs_live c
         WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
           AND c.role IS NULL AND c.kind = ANY (ARRAY['noop']) AND c.id <> ALL (v_named)
         ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED) c;
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
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_keep THEN
        DELETE FROM forge.jobs_live j WHERE j.id = ANY (p_ids) AND j.state = 'available';
        RETURN;
    END IF;
    WITH d AS (DELETE FROM forge.jobs_live j WHERE j.id = ANY (p_ids) AND j.state = 'available'
               RETURNING j.*)
    INSERT INTO forge.jobs_done
    SELECT d.id, d.namespace, d.queue, d.kind, d.args, 'completed', d.priority, d.run_at,
           d.attempt + 1, d.max_attempts, d.timeout_ms, d.role, d.epoch, d.unique_key, 'writes',
           d.attempted_at, clock_timestamp(), d.errors, d.cancel_requested, d.created_at,
           d.tenure, d.started_at, d.unstarted_rescues, d.limited, d.output, d.parents,
           d.parents_left, d.on_parent_failure, d.has_children, d.kind_limited
      FROM d;
END $$;
