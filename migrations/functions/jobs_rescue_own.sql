-- At a node's start: rescues the jobs the node's previous run left running. The node holds its
-- id's advisory lock (its node session), so no other live process can be running them.
--
-- A row a transaction of the previous run still holds is waited for (that session's
-- idle-in-transaction timeout bounds the wait).
CREATE OR REPLACE FUNCTION forge.jobs_rescue_own(
    p_namespace            text,
    p_node                 text,
    p_default_max_attempts integer
) RETURNS TABLE (id bigint, queue text, kind text, state text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_ids      bigint[];
    v_attempts integer[];
BEGIN
    SELECT array_agg(j.id), array_agg(j.attempt) INTO v_ids, v_attempts
      FROM forge.jobs j
     WHERE j.namespace = p_namespace AND j.node_id = p_node AND j.state = 'running';
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM forge.jobs_rescue(
            v_ids, v_attempts,
            array_fill('node ' || p_node || ' restarted during the attempt', ARRAY[cardinality(v_ids)]),
            array_fill(true, ARRAY[cardinality(v_ids)]),
            p_default_max_attempts, false);
    END IF;
END;
$$;
