-- Wakes every queue worker of the namespace (one notification per queue some node works,
-- from forge.job_lanes): a kind's jobs may sit in any queue, so a change of its limits may let
-- any of them claim more.
CREATE OR REPLACE FUNCTION forge.kind_limit_wake(p_namespace text)
RETURNS void
LANGUAGE sql
AS $$
    SELECT pg_notify('forge_jobs', p_namespace || ' ' || q.lane)
      FROM (SELECT DISTINCT l.lane FROM forge.job_lanes l
             WHERE l.namespace = p_namespace AND l.lane NOT LIKE '@%') q;
$$;
