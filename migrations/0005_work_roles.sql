-- Work with nowhere to run: a node advertises the roles its binary has work for (crons,
-- leader-only jobs, leader tasks, the built-in duties), campaigned for or not, beside those it
-- campaigns for (roles). The cluster's status reports a role that live nodes have work for and
-- none campaigns for. Nodes of the previous release leave it empty: they report nothing.
ALTER TABLE forge.nodes ADD COLUMN work_roles text[] NOT NULL DEFAULT '{}';

COMMENT ON COLUMN forge.nodes.work_roles IS
    'The roles this node''s binary has work for, campaigned for or not (roles: those it campaigns for).';
