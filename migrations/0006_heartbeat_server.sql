-- The run of the server a node's last heartbeat (or join) was written on (forge.server_run()):
-- the scheduler leader's watch compares it with the run it is on (forge.nodes_watch), to know
-- without a clock that a node whose sessions are all gone lost them while the server stayed up.
-- Nodes of the previous release leave it NULL: their killed sessions are found by the
-- heartbeat's silence alone.
ALTER TABLE forge.nodes ADD COLUMN heartbeat_server text;

COMMENT ON COLUMN forge.nodes.heartbeat_server IS
    'The run of the server the node''s last heartbeat or join was written on (forge.server_run()).';
