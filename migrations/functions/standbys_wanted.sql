-- Of the keys given, those with fewer than p_standbys waiting sessions: roles a reserve should
-- campaign for again. One scan of pg_locks.
CREATE OR REPLACE FUNCTION forge.standbys_wanted(p_keys bigint[], p_standbys integer) RETURNS bigint[]
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(array_agg(k.key), '{}')
      FROM unnest(p_keys) AS k(key)
      LEFT JOIN (
          SELECT lk.classid, lk.objid, count(*) AS waiting FROM pg_locks lk
           WHERE lk.locktype = 'advisory' AND NOT lk.granted AND lk.objsubid = 1
             AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           GROUP BY lk.classid, lk.objid
      ) w ON w.classid = ((k.key >> 32) & 4294967295)::oid AND w.objid = (k.key & 4294967295)::oid
     WHERE coalesce(w.waiting, 0) < p_standbys
$$;
