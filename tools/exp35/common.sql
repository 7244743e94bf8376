-- The prototypes' round trip, as forge.jobs_step's for completions only: record the previous
-- batch's completions (exp.finish), then claim up to 128 jobs (exp.claim), in one transaction.
-- p_unlock: the jobs whose completion the previous round trip committed, whose advisory locks
-- are released now (the lock variant; empty for the others). Each variant file defines
-- exp.claim() and exp.finish(ids, keep completed?).
CREATE FUNCTION exp.step(p_ids bigint[], p_atts integer[], p_keep boolean, p_unlock bigint[])
RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM pg_advisory_unlock(u) FROM unnest(p_unlock) AS u;
    IF cardinality(p_ids) > 0 THEN
        PERFORM exp.finish(p_ids, p_keep);
    END IF;
    RETURN QUERY SELECT * FROM exp.claim();
END $$;
