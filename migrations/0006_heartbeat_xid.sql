-- The transaction that wrote a node's last heartbeat (or join): the scheduler leader's watch
-- compares it with the transaction ids its own lock session has seen (forge.nodes_watch), to
-- know without a clock that the node heartbeated while the server stayed up. Nodes of the
-- previous release leave it NULL: their killed sessions are found by the heartbeat's age alone.
ALTER TABLE forge.nodes ADD COLUMN heartbeat_xid xid8;

COMMENT ON COLUMN forge.nodes.heartbeat_xid IS
    'The transaction of the node''s last heartbeat or join (pg_current_xact_id()).';
