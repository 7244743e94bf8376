-- Prunes completed and cancelled jobs older than the retention (forge.jobs_prune), fenced by
-- the compactor's tenure.
CREATE OR REPLACE FUNCTION forge.prune_finished_jobs(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint, p_retention_ms bigint, p_limit integer)
RETURNS bigint LANGUAGE sql AS $$
    SELECT forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    SELECT forge.jobs_prune(p_namespace, ARRAY['completed', 'cancelled'], p_retention_ms, p_limit);
$$;
