-- Deletes the jobs of p_ids that are not running (the admin API's delete, which its caller
-- audits) and returns how many it deleted. A deleted row's dependency edges go with it, after
-- its children counted its end (forge.jobs_parent_finished): a job deleted after it finished
-- ended as it finished; one deleted before (pending, available, scheduled, retryable) cancels a
-- child whose policy is 'cancel', and counts as done for one whose policy is 'run'.
CREATE OR REPLACE FUNCTION forge.jobs_delete(p_namespace text, p_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_n    bigint;
    v_gone bigint[];
    v_ends text[];
BEGIN
    WITH d AS (
        DELETE FROM forge.jobs j
         WHERE j.namespace = p_namespace AND j.id = ANY (p_ids) AND j.state <> 'running'
        RETURNING j.id,
                  CASE WHEN j.state IN ('completed', 'dead', 'cancelled') THEN j.state
                       ELSE 'deleted before it finished' END AS how,
                  j.has_children OR j.parents IS NOT NULL AS linked
    )
    SELECT count(*), array_agg(d.id) FILTER (WHERE d.linked),
           array_agg(d.how) FILTER (WHERE d.linked)
      INTO v_n, v_gone, v_ends
      FROM d;
    IF v_gone IS NOT NULL THEN
        PERFORM forge.jobs_parent_finished(v_gone, v_ends, true);
    END IF;
    RETURN v_n;
END;
$$;
