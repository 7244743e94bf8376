-- The backends of a node's sessions on this server: its pool, its node session and its lock
-- sessions (application_name forge:<pool|node|role>:<node>, cut to 63 bytes as PostgreSQL
-- cuts it).
CREATE OR REPLACE FUNCTION forge.node_backends(p_namespace text, p_node text)
RETURNS TABLE (pid integer, backend_start timestamptz, application_name text)
LANGUAGE sql STABLE
AS $$
    SELECT a.pid, a.backend_start, a.application_name::text FROM pg_stat_activity a
     WHERE a.datname = current_database()
       AND a.application_name IN (
           SELECT left('forge:' || p.purpose || ':' || p_node, 63)
             FROM (SELECT 'pool' AS purpose UNION ALL SELECT 'node'
                   UNION SELECT l.role FROM forge.leaders l WHERE l.namespace = p_namespace) p)
$$;
