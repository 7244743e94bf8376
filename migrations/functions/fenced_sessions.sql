-- The sessions inside a fenced transaction of the role, with what
-- they are doing.
CREATE OR REPLACE FUNCTION forge.fenced_sessions(p_namespace text, p_role text)
RETURNS TABLE (pid integer, state text, xact_start timestamptz)
LANGUAGE sql STABLE
AS $$
    SELECT lk.pid, a.state, a.xact_start FROM pg_locks lk
      LEFT JOIN pg_stat_activity a ON a.pid = lk.pid
     WHERE lk.locktype = 'advisory' AND lk.granted AND lk.objsubid = 2
       AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND lk.classid = hashtext('forge.fence')::oid
       AND lk.objid = hashtext(p_namespace || ' ' || p_role)::oid
$$;
