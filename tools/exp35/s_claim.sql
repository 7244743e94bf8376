-- S: today's writes without the rest of jobs_step (no lane lock, limits probe, two-pass lookups
-- or refusal report): the claim an update to 'running' (a non-HOT version, since state is in
-- every partial index's predicate: entries in the primary key and jobs_running), the completion
-- an update to 'completed' (another, with the primary key and jobs_finished) or a delete.
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE sql AS $$
    UPDATE forge.jobs j
       SET state = 'running', attempt = j.attempt + 1, node_id = 'writes',
           attempted_at = clock_timestamp(), started_at = clock_timestamp()
     WHERE j.ctid = ANY (ARRAY(
           SELECT c.ctid FROM forge.jobs c
            WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
              AND c.role IS NULL AND c.kind = ANY (ARRAY['noop'])
            ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED))
    RETURNING j.id, j.attempt
$$;
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_keep THEN
        UPDATE forge.jobs j SET state = 'completed', finished_at = clock_timestamp()
         WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes';
    ELSE
        DELETE FROM forge.jobs j
         WHERE j.id = ANY (p_ids) AND j.state = 'running' AND j.node_id = 'writes';
    END IF;
END $$;
