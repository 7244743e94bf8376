-- Deletes at most p_limit rows of forge.job_keys that block nothing any more: their job is gone
-- (pruned by retention, or deleted) and their period is over (or they had none), and returns
-- how many; fenced by the compactor's tenure. p_retention_ms is not used: a key's period is
-- its own. Rows an enqueuer holds are skipped and deleted at a later pass.
CREATE OR REPLACE FUNCTION forge.prune_job_keys(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.job_keys k
         WHERE (k.namespace, k.kind, k.unique_key) IN (
                   SELECT f.namespace, f.kind, f.unique_key FROM forge.job_keys f
                    WHERE f.namespace = p_namespace
                      AND (f.held_until IS NULL OR f.held_until < clock_timestamp())
                      AND NOT EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = f.job_id)
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED)
        RETURNING 1
    ) SELECT count(*) FROM d;
$$;
