-- S2: today's writes alone on today's layout (forge.jobs_live, completed jobs moved into
-- forge.jobs_done): the claim an update to 'running' (a non-HOT version: entries in the primary
-- key and jobs_running), the completion a move or a delete. The baseline for K, KH and P, which
-- are as stripped of the rest of forge.jobs_step.
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE sql AS $$
    UPDATE forge.jobs_live j
       SET state = 'running', attempt = j.attempt + 1, node_id = 'writes',
           attempted_at = clock_timestamp(), started_at = clock_timestamp()
     WHERE j.ctid = ANY (ARRAY(
           SELECT c.ctid FROM forge.jobs_live c
            WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
              AND c.role IS NULL AND c.kind = ANY (ARRAY['noop'])
            ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED))
    RETURNING j.id, j.attempt
$$;
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_keep THEN
        DELETE FROM forge.jobs_live j
         WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes';
        RETURN;
    END IF;
    WITH d AS (DELETE FROM forge.jobs_live j
                WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes'
               RETURNING j.*)
    INSERT INTO forge.jobs_done
    SELECT d.id, d.namespace, d.queue, d.kind, d.args, 'completed', d.priority, d.run_at,
           d.attempt, d.max_attempts, d.timeout_ms, d.role, d.epoch, d.unique_key, d.node_id,
           d.attempted_at, clock_timestamp(), d.errors, d.cancel_requested, d.created_at,
           d.tenure, d.started_at, d.unstarted_rescues, d.limited, d.output, d.parents,
           d.parents_left, d.on_parent_failure, d.has_children, d.kind_limited
      FROM d;
END $$;
