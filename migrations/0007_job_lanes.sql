-- A claim carries its worker's identity: the node's incarnation (forge.nodes.incarnation, one per
-- process) and its lane's generation. A lane is one worker of one node: a queue, or '@' || role
-- for a role's worker on the role's leader. forge.jobs_lane_take advances the generation (under
-- the lane lock, which every round trip of the lane holds shared): the worker's reconciliation
-- does, and so does a new incarnation of the node for its predecessor's lanes before it rescues
-- their jobs. forge.jobs_step claims only with the lane's current identity, so a claim that
-- reaches the server after its worker gave up on it and reconciled, or after its node restarted,
-- takes nothing.
CREATE TABLE forge.job_lanes (
    namespace   text        NOT NULL,
    node_id     text        NOT NULL,
    lane        text        NOT NULL,
    incarnation bigint      NOT NULL,
    -- From forge.job_lane_generations: never the same twice, whichever lane takes it.
    generation  bigint      NOT NULL,
    taken_at    timestamptz NOT NULL,
    PRIMARY KEY (namespace, node_id, lane),
    FOREIGN KEY (namespace, node_id) REFERENCES forge.nodes ON DELETE CASCADE
);

CREATE SEQUENCE forge.job_lane_generations;

COMMENT ON TABLE forge.job_lanes IS
    'The identity a job worker''s claims must carry (the node''s incarnation, the lane''s generation), advanced by its reconciliations and by a new incarnation of its node; a claim with another identity takes nothing. Deleted with the node''s row.';

-- Rescues of an attempt whose start was never recorded: a job claimed ahead of a free slot whose
-- node died before the mark of its start landed - perhaps killed by the handler itself (a stack
-- overflow, an out-of-memory kill, panic = "abort"). The first three such rescues of a job do not
-- count as attempts; later ones do, so that such a job ends dead instead of killing nodes forever.
ALTER TABLE forge.jobs ADD COLUMN unstarted_rescues integer NOT NULL DEFAULT 0;
