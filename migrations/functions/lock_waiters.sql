-- Sessions waiting for an advisory lock key (not granted), in this database.
CREATE OR REPLACE FUNCTION forge.lock_waiters(p_key bigint) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT count(*) FROM pg_locks lk
     WHERE lk.locktype = 'advisory' AND NOT lk.granted
       AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND lk.classid = ((p_key >> 32) & 4294967295)::oid
       AND lk.objid = (p_key & 4294967295)::oid
       AND lk.objsubid = 1
$$;
