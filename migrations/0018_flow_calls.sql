-- Job dependencies without triggers: FORGE's writers count a parent's end in its children
-- themselves (forge.jobs_parent_finished, called in the transaction that ends the parent), and
-- the scheduler leader's pass counts the ends that an operator's SQL wrote (forge.jobs_maintain).
-- The triggers' AFTER row events cost every claim and every completion a second fetch of its
-- row, for the few jobs with children.
--
-- The triggers go here (the function file of forge.jobs_parent_finished drops the trigger
-- function with them too, for a database whose migrations ran before its function files were
-- applied). Between this migration and the function files that the same start applies, a
-- parent ended by an older body is counted by the pass.
DROP TRIGGER IF EXISTS jobs_parent_ended ON forge.jobs;
DROP TRIGGER IF EXISTS jobs_linked_deleted ON forge.jobs;

-- The pass reads the edges not yet counted (few: those of parents still queued or running).
CREATE INDEX job_edges_open ON forge.job_edges (parent_id) WHERE NOT resolved;
