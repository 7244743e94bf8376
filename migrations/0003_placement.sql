-- Leadership placement: roles spread across the nodes, and nodes that prefer roles
-- (forge.placement_move). A graceful handoff may name the node it is for (forge.release with
-- p_to): until handoff_until, a waiter that is granted the lock and is not that node passes the
-- lock on (forge.campaign), so the named node, waiting behind it, takes it. The tenure that
-- began with such a move remembers when (moved_at): it is not moved again for a while.

ALTER TABLE forge.leaders
    ADD COLUMN handoff_to    text,
    ADD COLUMN handoff_until timestamptz,
    ADD COLUMN moved_at      timestamptz;

COMMENT ON COLUMN forge.leaders.handoff_to IS
    'The node a graceful handoff is for (a placement move), until handoff_until: other waiters pass the lock on.';
COMMENT ON COLUMN forge.leaders.moved_at IS
    'When this tenure began with a placement move (NULL: an election, a failover, a step-down).';

ALTER TABLE forge.nodes ADD COLUMN prefers text[] NOT NULL DEFAULT '{}';

COMMENT ON COLUMN forge.nodes.prefers IS
    'The roles this node prefers to lead ([node] prefer_roles).';

ALTER TABLE forge.events DROP CONSTRAINT events_kind_check;
ALTER TABLE forge.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'leader_elected', 'leader_released', 'leader_fenced', 'leader_lost', 'leader_rebalanced',
    'node_joined', 'node_left', 'node_drifted', 'node_recovered', 'node_down',
    'node_rejoined', 'node_forgotten', 'admin_action'));

COMMENT ON TABLE forge.events IS
    'Cluster history: leader_elected (detail.failover: the previous leader did not hand over; detail.gap_ms), leader_released (graceful handoff), leader_rebalanced (a placement move: detail.to, why), leader_fenced (an expired holder was terminated), node_joined, node_left, node_drifted, node_recovered, node_down (detail.reason), node_rejoined, node_forgotten, admin_action (an operator''s write: detail.action, subject, by), leader_lost (a leader that lost its leadership without handing over, as it saw it: detail.reason).';
