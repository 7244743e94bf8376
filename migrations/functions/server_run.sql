-- Which run of this PostgreSQL server this is, as a value: its postmaster's start time (as a
-- number: the same text whatever the session's time zone) and the lowest pid among its own
-- processes (no database, no user: the checkpointer, the background writer, ...), which a crash
-- restart replaces while the postmaster keeps its start time. Two readings are equal only on one
-- run of the server: a restart, a crash restart or a failover to another server changes it.
-- (Compared for equality, never as a time. One case is not told apart: a crash restart that
-- gives the server's first process the very pid its predecessor had, after the pid counter
-- wrapped around to it.)
--
-- A node's heartbeat records it (forge.nodes.heartbeat_server): forge.nodes_watch reads from it
-- that a node whose sessions are all gone lost them while the server stayed up, without a clock.
CREATE OR REPLACE FUNCTION forge.server_run()
RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT extract(epoch FROM pg_postmaster_start_time())::text || ' '
           || coalesce((SELECT min(a.pid) FROM pg_stat_get_activity(NULL) a
                         WHERE a.datid IS NULL AND a.usesysid IS NULL)::text, '?');
$$;
