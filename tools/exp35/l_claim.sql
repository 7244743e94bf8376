-- L: the running state is a session advisory lock keyed by the job id (Que's design): the claim
-- writes nothing. It walks jobs_claim in order taking pg_try_advisory_lock(id) (a job another
-- session holds is skipped; one this session holds would be taken again: a worker must pass
-- its own running jobs to exclude), then looks again with a fresh snapshot at the jobs it
-- locked, and lets go of those no longer available: a claim whose snapshot predates another
-- session's completion would otherwise run the job again once that session unlocked it.
-- Completion: an update to 'completed' that counts the attempt and names the node (attempts
-- are counted at the outcome), or a delete. Its locks are released by the session's next round
-- trip (exp.step's p_unlock), after the completion committed: released before, another claim
-- could lock the job and still see it available.
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_locked bigint[];
    v_kept bigint[];
BEGIN
    SELECT array_agg(c.id) INTO v_locked FROM (
        SELECT c.id FROM forge.jobs c
         WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
           AND c.role IS NULL AND c.kind = ANY (ARRAY['noop']) AND pg_try_advisory_lock(c.id)
         ORDER BY c.priority, c.run_at, c.id LIMIT 128) c;
    SELECT array_agg(j.id) INTO v_kept FROM forge.jobs j
     WHERE j.id = ANY (v_locked) AND j.state = 'available';
    PERFORM pg_advisory_unlock(u) FROM unnest(v_locked) AS u WHERE u <> ALL (v_kept);
    RETURN QUERY SELECT j.id, j.attempt + 1 FROM forge.jobs j WHERE j.id = ANY (v_kept);
END $$;
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_keep THEN
        UPDATE forge.jobs j SET state = 'completed', attempt = j.attempt + 1, node_id = 'writes',
               finished_at = clock_timestamp()
         WHERE j.id = ANY (p_ids) AND j.state = 'available';
    ELSE
        DELETE FROM forge.jobs j WHERE j.id = ANY (p_ids) AND j.state = 'available';
    END IF;
END $$;
